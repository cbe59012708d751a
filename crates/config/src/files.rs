//! The small files settings point at — block keys, TLS pre-shared keys, tenant secrets — read
//! so that every error names the setting (or flag), the file, what it must hold and the fix,
//! and tells apart a file that does not exist, one that cannot be read (the only case whose
//! fix is permissions), one of binary data and one whose text is not what is expected.

use std::io::ErrorKind;
use std::path::Path;

use crate::ConfigError;

/// What a 256-bit key file (a block key, a TLS pre-shared key) holds, for messages.
pub const KEY32_FORMAT: &str = "64 hexadecimal characters (a 256-bit key) on one line";

/// Who must be able to read a file that `key` names.
fn reader(key: &str) -> &'static str {
    if key.starts_with("cache.") {
        "the mount's user"
    } else if key.starts_with("server.") {
        "the lender's user"
    } else {
        "the user running farcache"
    }
}

/// `key`'s file `path` could not be examined or read (`e`); `create` is the fix when it does
/// not exist.
fn io_error(key: &'static str, path: &Path, e: &std::io::Error, create: &str) -> ConfigError {
    let shown = path.display();
    let readable = format!("make it readable by {}", reader(key));
    match e.kind() {
        ErrorKind::NotFound => ConfigError::invalid(key, format!("{shown} does not exist (no such file)"), create),
        ErrorKind::IsADirectory => ConfigError::invalid(key, format!("{shown} is a directory, not a file"), create),
        ErrorKind::NotADirectory => ConfigError::invalid(
            key,
            format!("{shown} does not exist: a part of the path before the file name is not a directory"),
            create,
        ),
        ErrorKind::PermissionDenied => {
            ConfigError::invalid(key, format!("cannot read {shown}: permission denied"), readable)
        }
        _ => ConfigError::invalid(key, format!("cannot read {shown}: {e}"), readable),
    }
}

/// The problem with a file of `n` bytes that are not UTF-8 text where text was expected:
/// `instead` ends the sentence.
fn binary(path: &Path, n: usize, instead: &str) -> String {
    format!("{} holds binary data ({n} bytes that are not UTF-8 text), {instead}", path.display())
}

/// The text of `path`, which `key` names and which holds `what`. Errors name `key` and the
/// file: `create` is the fix when it does not exist or holds binary data; one that cannot be
/// read (permissions, I/O) is told to be made readable. No check of owner or mode: see
/// [`read_private_file`] for secrets that must stay private.
pub fn read_text_file(key: &'static str, path: &Path, what: &str, create: &str) -> Result<String, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| io_error(key, path, &e, create))?;
    String::from_utf8(bytes).map_err(|e| {
        ConfigError::invalid(
            key,
            binary(path, e.as_bytes().len(), &format!("where {what} must be written as text")),
            create,
        )
    })
}

/// The bytes of `path`, a regular file that only its owner can read or write, holding
/// `what`; errors name `key`, the file and the fix (`create` when it does not exist).
fn read_private_bytes(key: &'static str, path: &Path, what: &str, create: &str) -> Result<Vec<u8>, ConfigError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| io_error(key, path, &e, create))?;
    if !meta.is_file() {
        return Err(ConfigError::invalid(
            key,
            format!("{shown} is not a regular file"),
            format!("point it at a file holding {what}"),
        ));
    }
    let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
    if mode & 0o077 != 0 {
        return Err(ConfigError::invalid(
            key,
            format!("{shown} is open to group or others (mode {mode:03o}): {what} would leak"),
            format!("run `chmod 600 {shown}`"),
        ));
    }
    std::fs::read(path).map_err(|e| io_error(key, path, &e, create))
}

/// The text of `path`, a regular file that only its owner can read or write, holding
/// `what`; errors name `key`, the file and the fix (`create` when it does not exist or holds
/// binary data rather than text; making it readable only when it cannot be read).
pub fn read_private_file(key: &'static str, path: &Path, what: &str, create: &str) -> Result<String, ConfigError> {
    let bytes = read_private_bytes(key, path, what, create)?;
    String::from_utf8(bytes).map_err(|e| {
        ConfigError::invalid(
            key,
            binary(path, e.as_bytes().len(), &format!("where {what} must be written as text")),
            create,
        )
    })
}

/// A 256-bit key from `path`, a private file (as [`read_private_file`]) holding `what` as
/// [`KEY32_FORMAT`] (`farcache keygen`). Every error about the contents — binary data, empty,
/// the wrong length, a character that is not a hex digit — names `key`, the file, the format
/// and `create` (which should name `farcache keygen --out FILE`).
pub fn read_key32_file(key: &'static str, path: &Path, what: &str, create: &str) -> Result<[u8; 32], ConfigError> {
    let expected = format!("it must hold {KEY32_FORMAT}; {create}");
    let bytes = read_private_bytes(key, path, what, &expected)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let n = e.as_bytes().len();
        let raw = if n == 32 { " (if these are the key's 32 raw bytes: a key file holds them in hex)" } else { "" };
        ConfigError::invalid(key, format!("{}{raw}", binary(path, n, &format!("not {what} written in hex"))), &expected)
    })?;
    parse_hex_key32(&text)
        .map_err(|why| ConfigError::invalid(key, format!("{} does not hold {what}: {why}", path.display()), &expected))
}

/// A 256-bit key from a key file's text (`farcache keygen`): 64 hexadecimal digits (either
/// case) on one line, surrounding white space and empty lines ignored. The error says what is
/// wrong, as the end of a sentence starting with the file's name; it never shows the file's
/// contents (they may be a secret).
pub fn parse_hex_key32(text: &str) -> Result<[u8; 32], String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(line) = lines.next() else {
        return Err("it is empty".into());
    };
    if lines.next().is_some() {
        return Err("it has more than one line".into());
    }
    let n = line.chars().count();
    if n != 64 {
        return Err(format!("its key is {n} characters long, not 64 hexadecimal characters"));
    }
    if let Some(i) = line.chars().position(|c| !c.is_ascii_hexdigit()) {
        return Err(format!("character {} of its key is not a hex digit (0-9, a-f, A-F)", i + 1));
    }
    let mut out = [0u8; 32];
    for (i, pair) in line.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).expect("checked: hex digits only");
        out[i] = (digit(pair[0]) * 16 + digit(pair[1])) as u8;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory under the system's temporary one, removed on drop.
    struct Dir(std::path::PathBuf);

    impl Dir {
        fn new() -> Dir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("farcache-config-test-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).unwrap();
            Dir(p)
        }
        fn file(&self, name: &str, content: &[u8], mode: u32) -> std::path::PathBuf {
            let p = self.0.join(name);
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const LINE: &str = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF\n";
    const CREATE: &str = "create one with `farcache keygen --out FILE`";

    #[test]
    fn hex_keys_parse_and_bad_ones_say_why() {
        assert_eq!(parse_hex_key32(LINE).unwrap()[..3], [0x00, 0x11, 0x22]);
        assert_eq!(parse_hex_key32(LINE).unwrap()[31], 0xff);
        assert_eq!(parse_hex_key32(&format!("\n  {}  \r\n\n", LINE.trim())).unwrap()[31], 0xff);
        for (text, why) in [
            ("", "it is empty"),
            (" \n\n\t\n", "it is empty"),
            (&LINE[..63], "63 characters long, not 64 hexadecimal characters"),
            (&format!("{}00", LINE.trim()), "66 characters long, not 64"),
            (&format!("{LINE}{LINE}"), "more than one line"),
            (&format!("{}g", &LINE[..63]), "character 64 of its key is not a hex digit"),
            (&format!("+{}", &LINE[1..]), "character 1 of its key is not a hex digit"),
            // 64 characters, not 64 bytes: never cut inside a character, never a panic.
            (&"é".repeat(64), "character 1 of its key is not a hex digit"),
            (&"é".repeat(32), "32 characters long"),
        ] {
            let e = parse_hex_key32(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn key_files_name_the_key_the_file_the_format_and_keygen() {
        let d = Dir::new();
        let good = d.file("good", LINE.as_bytes(), 0o600);
        assert_eq!(read_key32_file("cache.tls_psk_file", &good, "the pre-shared key", CREATE).unwrap()[1], 0x11);
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("binary", vec![0xff, 0xfe, 0x00, 0x9c, 0x80], "holds binary data (5 bytes that are not UTF-8 text)"),
            ("raw32", (0..32).map(|i| 0x80 + i as u8).collect(), "32 raw bytes"),
            ("empty", Vec::new(), "it is empty"),
            ("short", b"deadbeef\n".to_vec(), "8 characters long, not 64 hexadecimal characters"),
            ("nonhex", "xy".repeat(32).into_bytes(), "character 1 of its key is not a hex digit"),
            ("base64", b"3q2+7w==\n".to_vec(), "8 characters long"),
        ];
        for (name, content, why) in cases {
            let p = d.file(name, &content, 0o600);
            let e = read_key32_file("cache.tls_psk_file", &p, "the pre-shared key", CREATE).unwrap_err().to_string();
            let shown = p.display().to_string();
            assert!(e.starts_with(&format!("cache.tls_psk_file: {shown} ")), "{name}: {e}");
            assert!(e.contains(why), "{name}: {e}");
            assert!(e.contains("64 hexadecimal characters (a 256-bit key)") && e.contains(CREATE), "{name}: {e}");
            assert!(!e.contains("readable") && !e.contains("UTF-8;"), "{name}: the fix is the contents: {e}");
        }
        let missing = d.0.join("missing");
        let e = read_key32_file("server.tls_psk_file", &missing, "the pre-shared key", CREATE).unwrap_err().to_string();
        assert!(e.contains(&format!("{} does not exist (no such file)", missing.display())), "{e}");
        assert!(e.contains(CREATE) && !e.contains("readable"), "{e}");
        let e = read_key32_file("--tls-psk-file", &d.0.join("good/x"), "the pre-shared key", CREATE)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--tls-psk-file: ") && e.contains("not a directory") && e.contains(CREATE), "{e}");
        // Existing checks stay: mode, regular file.
        let open = d.file("open", LINE.as_bytes(), 0o644);
        let e = read_key32_file("cache.key_file", &open, "the block key", CREATE).unwrap_err().to_string();
        assert!(e.contains("open to group or others") && e.contains("chmod 600"), "{e}");
        let e = read_key32_file("cache.key_file", &d.0, "the block key", CREATE).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn private_and_text_files_tell_binary_data_from_permissions() {
        let d = Dir::new();
        let p = d.file("bin", &[0xc3, 0x28, 0x00], 0o600);
        let create = "write the tenant secret on its first line";
        let e = read_private_file("cache.key_file", &p, "the block key", create).unwrap_err().to_string();
        assert!(
            e.contains(
                "holds binary data (3 bytes that are not UTF-8 text), where the block key must be written as text"
            ),
            "{e}"
        );
        assert!(e.ends_with(create) && !e.contains("readable"), "{e}");
        let e = read_text_file("server.tenant.secret_file", &p, "the secret", create).unwrap_err().to_string();
        assert!(
            e.starts_with("server.tenant.secret_file: ") && e.contains("binary data") && e.ends_with(create),
            "{e}"
        );
        let e = read_text_file("--secret-file", &d.0.join("none"), "the secret", create).unwrap_err().to_string();
        assert!(e.starts_with("--secret-file: ") && e.contains("does not exist (no such file)"), "{e}");
        let e = read_text_file("--secret-file", &d.0, "the secret", create).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        assert_eq!(read_text_file("k", &d.file("t", b"s3cret\n", 0o644), "s", create).unwrap(), "s3cret\n");
    }

    #[test]
    fn only_a_file_that_cannot_be_read_is_told_to_be_made_readable() {
        let e = std::io::Error::from(ErrorKind::PermissionDenied);
        let p = Path::new("/etc/farcache/k");
        for (key, who) in [
            ("cache.key_file", "the mount's user"),
            ("server.tls_psk_file", "the lender's user"),
            ("--tls-psk-file", "the user running farcache"),
        ] {
            let m = io_error(key, p, &e, "CREATE").to_string();
            assert!(m.starts_with(&format!("{key}: cannot read /etc/farcache/k: permission denied")), "{m}");
            assert!(m.ends_with(&format!("make it readable by {who}")), "{m}");
        }
        let m = io_error("cache.key_file", p, &std::io::Error::from(ErrorKind::NotFound), "CREATE").to_string();
        assert_eq!(m, "cache.key_file: /etc/farcache/k does not exist (no such file); CREATE");
    }

    #[test]
    fn config_files_name_the_flag_the_file_and_the_fix() {
        #[derive(serde::Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct C {
            capacity: Option<crate::ByteSize>,
        }
        let d = Dir::new();
        let load = |p: &Path| crate::load_toml::<C>("--config", p).unwrap_err().to_string();
        let missing = d.0.join("farcache.toml");
        let e = load(&missing);
        let m = missing.display();
        assert!(e.starts_with(&format!("--config {m}: no such file; ")), "{e}");
        assert!(e.contains(&format!("`farcache config > {m}`")) && !e.contains("os error"), "{e}");
        let e = load(&d.file("bin.toml", &[0x00, 0xff, 0xfe, 0x01], 0o644));
        assert!(e.contains("bin.toml: holds binary data (4 bytes that are not UTF-8 text), not a TOML configuration"));
        assert!(e.contains("point --config at a TOML file") && e.contains("farcache config >"), "{e}");
        let e = load(&d.file("key.toml", LINE.as_bytes(), 0o644));
        assert!(e.starts_with("--config ") && e.contains("key.toml is not a valid farcache configuration"), "{e}");
        assert!(e.contains("TOML parse error at line 1") && e.contains("`farcache config` prints the template"), "{e}");
        let e = load(&d.file("typo.toml", b"capacty = 1\n", 0o644));
        assert!(e.contains("capacty") && e.contains("`farcache config` prints the template"), "{e}");
        let e = load(&d.0);
        assert!(e.contains("is a directory, not a TOML file"), "{e}");
        assert!(crate::load_toml::<C>("--config", &d.file("ok.toml", b"capacity = \"4KiB\"\n", 0o644)).is_ok());
    }
}
