//! The control channel of a running `farcache mount`, end to end with the real binary, a
//! real FUSE mount and real lender processes: `farcache stats MNT` sees the counters move,
//! `farcache lenders MNT --add/--remove` changes the lenders while the mount serves, clients
//! that break the protocol cost the mount nothing, and a missing mount is a clear error.
//!
//! These tests need root and FUSE (CI and developer machines run as root).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use farcache_testkit::{
    pattern, require_root, run_with_timeout, wait_until, AlignedBuf, DirectReader, MountProcess, ServerProcess,
    LENDERS_FIRST,
};
use serde_json::Value;

/// Every command a test runs must finish within this.
const CMD_TIMEOUT: Duration = Duration::from_secs(30);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn farcache(args: &[&str]) -> std::process::Output {
    farcache_testkit::run_bin(bin(), args)
}

use farcache_testkit::text;

/// `farcache ARGS --json`, which must succeed; its output parsed.
fn json(args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.push("--json");
    let out = farcache(&a);
    assert!(out.status.success(), "farcache {a:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("farcache {a:?}: {e}: {}", text(&out.stdout)))
}

fn mount_stats(mnt: &Path) -> Value {
    json(&["stats", mnt.to_str().unwrap()])
}

fn lenders(mnt: &Path, extra: &[&str]) -> Value {
    let mut a = vec!["lenders", mnt.to_str().unwrap()];
    a.extend_from_slice(extra);
    json(&a)
}

fn lender_addrs(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|l| l["addr"].as_str().unwrap().to_string()).collect()
}

/// A lender's STATS document (what it holds, what it served).
fn server_stats(addr: &str) -> Value {
    json(&["stats", "--server", addr])
}

/// A backing directory with one file, and an empty mount point, in a fresh temp dir.
struct Dirs {
    root: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
}

impl Dirs {
    fn new(files: &[(&str, &[u8])]) -> Dirs {
        require_root("the mount control tests");
        let root = tempfile::tempdir().unwrap();
        let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mnt).unwrap();
        for (name, data) in files {
            fs::write(backing.join(name), data).unwrap();
        }
        Dirs { root, backing, mnt }
    }
    fn mount(&self, args: &[&str]) -> MountProcess {
        MountProcess::start(bin(), &self.backing, &self.mnt, args, &self.root.path().join("mount.log"))
    }
}

/// Blocks 0..n in a scattered order (613 is prime to n = 2^k).
fn scattered(n: u64) -> Vec<u64> {
    (0..n).map(|i| (i * 613) % n).collect()
}

fn u(v: &Value, path: &str) -> u64 {
    let mut x = v;
    for k in path.split('.') {
        x = &x[k];
    }
    x.as_u64().unwrap_or_else(|| panic!("no counter {path} in {v:#}"))
}

#[test]
fn stats_show_hits_on_the_second_pass() {
    let srv = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let addr = srv.addr().to_string();
    let data = pattern(8 << 20, 11);
    let d = Dirs::new(&[("f", &data)]);
    let m = d.mount(&["--server", &addr, LENDERS_FIRST[0], LENDERS_FIRST[1]]);

    let before = mount_stats(&d.mnt);
    assert_eq!(u(&before, "remote.hits"), 0, "{before:#}");
    assert_eq!(lender_addrs(&before["lenders"]), [addr.as_str()]);

    let order = scattered(2048);
    let mut r = DirectReader::open(&d.mnt.join("f"));
    r.pass(&order, &data);
    // Fills are asynchronous: wait (bounded) until the lender holds the blocks.
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || u(&server_stats(&addr), "blocks") >= 2000),
        "the lender never got the first pass's blocks: {:#}",
        server_stats(&addr)
    );
    let mid = mount_stats(&d.mnt);
    r.pass(&order, &data);
    let after = mount_stats(&d.mnt);

    let hits = u(&after, "remote.hits") - u(&mid, "remote.hits");
    assert!(hits >= 1800, "second pass: {hits} hits of 2048\n{after:#}");
    // The first pass: each miss read its aligned 16 KiB read-around window from the disk and
    // filled all of it, so a neighbour read later may already be a lender hit. Every read was
    // one or the other, and every window was read from the disk at most once per block read.
    let (disk1, remote1) = (u(&mid, "engine.disk_reads"), u(&mid, "engine.remote_reads"));
    assert_eq!(disk1 + remote1, 2048, "{mid:#}");
    assert!(disk1 >= 2048 / 4, "{mid:#}");
    assert_eq!(u(&mid, "engine.read_arounds"), disk1, "{mid:#}");
    assert_eq!(u(&mid, "remote.hits"), remote1, "{mid:#}");
    assert!(u(&after, "remote.bytes_from_servers") >= hits * 4096);
    assert!(u(&mid, "remote.bytes_to_servers") >= 2000 * 4096, "{mid:#}");
    assert!(u(&after, "engine.remote_reads") - u(&mid, "engine.remote_reads") >= 1800);
    assert_eq!(u(&after, "remote.invalidations"), 0);
    assert!(u(&after, "index.memory_bytes") > 0, "{after:#}");
    assert!(after["lenders"][0]["connected"].as_bool().unwrap(), "{after:#}");

    // A sequential read of the whole file goes to the disk: a bypass, counted.
    let seq0 = u(&after, "engine.sequential_bypasses");
    let mut f = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(d.mnt.join("f")).unwrap();
    let mut big = AlignedBuf::new(1 << 20);
    let n = f.read(big.buf()).unwrap();
    assert_eq!(&big.buf()[..n], &data[..n]);
    let s = mount_stats(&d.mnt);
    assert!(u(&s, "engine.sequential_bypasses") > seq0, "{s:#}");

    // A write retires cached copies: invalidations.
    let w = OpenOptions::new().write(true).open(d.mnt.join("f")).unwrap();
    w.write_all_at(&[7u8; 8192], 0).unwrap();
    drop(w);
    assert!(u(&mount_stats(&d.mnt), "remote.invalidations") >= 1);

    // The table names what it shows.
    let out = farcache(&["stats", d.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    for word in ["hit ratio", "lenders", "from lenders", "invalidations", "fallbacks", "sequential", "index", &addr] {
        assert!(t.contains(word), "no {word:?} in the table:\n{t}");
    }
    drop(r);
    drop(f);
    m.stop();
}

#[test]
fn lenders_are_added_and_removed_while_mounted() {
    let a = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let b = ServerProcess::start(bin(), &["--capacity", "64MiB"], None);
    let (aa, ba) = (a.addr().to_string(), b.addr().to_string());
    let (one, two) = (pattern(8 << 20, 21), pattern(8 << 20, 22));
    let d = Dirs::new(&[("one", &one), ("two", &two)]);
    let m = d.mount(&["--server", &aa, LENDERS_FIRST[0], LENDERS_FIRST[1]]);
    let mnt = d.mnt.to_str().unwrap();

    assert_eq!(lender_addrs(&lenders(&d.mnt, &[])), [aa.as_str()]);
    let list = lenders(&d.mnt, &["--add", &ba]);
    assert_eq!(lender_addrs(&list), [aa.clone(), ba.clone()]);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            lenders(&d.mnt, &[]).as_array().unwrap().iter().all(|l| l["connected"] == true)
        }),
        "the new lender never connected: {:#}",
        lenders(&d.mnt, &[])
    );

    // Reads fill both lenders: blocks land on the new one (about half of them).
    let b0 = u(&server_stats(&ba), "blocks");
    let order = scattered(2048);
    let mut r = DirectReader::open(&d.mnt.join("one"));
    r.pass(&order, &one);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || u(&server_stats(&ba), "blocks") >= b0 + 500),
        "blocks did not land on the added lender: {:#}",
        server_stats(&ba)
    );
    r.pass(&order, &one);
    let s = mount_stats(&d.mnt);
    let on_b = s["lenders"].as_array().unwrap().iter().find(|l| l["addr"] == ba).unwrap().clone();
    assert!(on_b["hits"].as_u64().unwrap() >= 500, "the added lender serves hits: {s:#}");

    // The table lists both.
    let out = farcache(&["lenders", mnt]);
    assert!(out.status.success());
    let t = text(&out.stdout);
    assert!(t.contains(&aa) && t.contains(&ba) && t.contains("connected"), "{t}");

    // Mistakes are errors, and change nothing.
    let out = farcache(&["lenders", mnt, "--add", &ba]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("already"), "{}", text(&out.stderr));
    let out = farcache(&["lenders", mnt, "--remove", "127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("not in the set"), "{}", text(&out.stderr));
    let out = farcache(&["lenders", mnt, "--add", "not an address"]);
    assert!(!out.status.success());
    assert_eq!(lender_addrs(&lenders(&d.mnt, &[])), [aa.clone(), ba.clone()]);

    // Removed: nothing more lands on it, and reads go on, correct, from the one left.
    let list = lenders(&d.mnt, &["--remove", &ba]);
    assert_eq!(lender_addrs(&list), [aa.as_str()]);
    std::thread::sleep(Duration::from_millis(300)); // fills already sent may still land
    let puts_b = u(&server_stats(&ba), "puts");
    let mut r2 = DirectReader::open(&d.mnt.join("two"));
    r2.pass(&order, &two);
    r.pass(&order, &one);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(u(&server_stats(&ba), "puts"), puts_b, "a removed lender still gets blocks");
    assert!(u(&server_stats(&aa), "blocks") >= 2000);
    drop(r);
    drop(r2);
    m.stop();
}

#[test]
fn a_missing_mount_is_a_clear_error() {
    require_root("the mount control tests");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    for args in [
        vec!["stats", dir],
        vec!["stats", dir, "--json"],
        vec!["lenders", dir],
        vec!["lenders", dir, "--add", "127.0.0.1:7411"],
    ] {
        let out = farcache(&args);
        assert!(!out.status.success(), "{args:?}");
        let e = text(&out.stderr);
        assert!(
            e.contains(&format!("no farcache mount answers at {dir} (socket ")) && e.contains("is it mounted?"),
            "{args:?}: {e}"
        );
        assert!(out.stdout.is_empty());
    }
    let missing = tmp.path().join("nope");
    let out = farcache(&["stats", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no farcache mount answers at"), "{}", text(&out.stderr));
    // A socket file that nobody answers on (a daemon killed with SIGKILL leaves one).
    let sock = tmp.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let out = farcache(&["stats", dir, "--control-socket", sock.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is it mounted?"), "{}", text(&out.stderr));
    // The two ways of naming what to ask do not mix.
    assert!(!farcache(&["stats", dir, "--server", "127.0.0.1:1"]).status.success());
    assert!(!farcache(&["stats"]).status.success());
    assert!(!farcache(&["stats", dir, "--tenant", "db1"]).status.success(), "--tenant is for --server");
}

/// The control socket a daemon says (in its log) it answers on.
fn socket_of(m: &MountProcess) -> PathBuf {
    let log = m.log_text();
    let line = log.lines().find_map(|l| l.split("control socket ").nth(1)).unwrap_or_else(|| panic!("{log}"));
    PathBuf::from(line.trim())
}

/// Send `bytes` on a fresh connection; the answer line, if any, within `timeout`.
fn raw(sock: &Path, bytes: &[u8], timeout: Duration) -> String {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s.set_write_timeout(Some(timeout)).unwrap();
    let _ = s.write_all(bytes);
    let mut line = String::new();
    let _ = BufReader::new(s).read_line(&mut line);
    line
}

#[test]
fn hostile_control_clients_do_not_hurt_the_mount() {
    let data = pattern(1 << 20, 31);
    let d = Dirs::new(&[("f", &data)]);
    let sock = d.root.path().join("ctl.sock");
    let s = sock.to_str().unwrap();
    let m = d.mount(&["--control-socket", s, "--routing", "adaptive"]);
    let meta = fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // Garbage, wrong JSON, unknown commands: an error line each.
    for bad in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        b"\x00\x01\x02\xff\n",
        b"{\"cmd\":\"shutdown\"}\n",
        b"{\"cmd\":\"add_lender\",\"addr\":\"../../etc\"}\n",
        b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
    ] {
        let line = raw(&sock, bad, Duration::from_secs(10));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{bad:?}: {line:?}: {e}"));
        assert_eq!(v["ok"], false, "{bad:?}: {v}");
    }
    // Deeply nested JSON within the line limit.
    let deep = format!("{}\n", "[".repeat(4000));
    assert!(raw(&sock, deep.as_bytes(), Duration::from_secs(10)).contains("\"ok\":false"));
    // A flood without a newline is cut off at the line limit.
    let line = raw(&sock, &vec![b'x'; 4 << 20], Duration::from_secs(10));
    assert!(line.contains("longer than 4096 bytes"), "{line:?}");
    // Many connections that say nothing: the ones past the limit are told so at once.
    let idle: Vec<UnixStream> = (0..20).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    let t0 = Instant::now();
    // (A raw connection, not the CLI: the idle ones are cut off after 5 s, and starting a
    // process on a loaded machine can take longer than that.)
    let refused = wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
        raw(&sock, b"{\"cmd\":\"stats\"}\n", Duration::from_secs(5)).contains("too many control connections")
    });
    assert!(refused, "connections past the limit were not refused");
    // Meanwhile the mount serves files as ever.
    assert_eq!(fs::read(d.mnt.join("f")).unwrap(), data);
    fs::write(d.mnt.join("g"), b"written while the control socket was flooded").unwrap();
    // The idle ones are cut off within a few seconds, and the control socket answers again.
    assert!(
        wait_until(Duration::from_secs(20), Duration::from_millis(100), || farcache(&[
            "stats",
            "--control-socket",
            s,
            "--json"
        ])
        .status
        .success()),
        "the control socket never recovered"
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    drop(idle);
    // A client that connects and vanishes mid-line.
    for _ in 0..50 {
        let mut c = UnixStream::connect(&sock).unwrap();
        let _ = c.write_all(b"{\"cmd\":\"sta");
    }
    // They are gone, but the daemon may not have seen every hang-up yet: until it has, a new
    // client can still be told "too many control connections". Within a few seconds it answers.
    let answered = || farcache(&["stats", d.mnt.to_str().unwrap(), "--control-socket", s]).status.success();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(100), answered),
        "the control socket never recovered from clients that vanished mid-line"
    );
    let st = json(&["stats", d.mnt.to_str().unwrap(), "--control-socket", s]);
    assert!(st["backing"].is_object(), "{st:#}");
    assert_eq!(st["routing"]["mode"], "adaptive", "--routing adaptive: {st:#}");
    assert_eq!(st["remote_tier"], "embedded", "{st:#}");
    assert_eq!(fs::read(d.backing.join("g")).unwrap(), b"written while the control socket was flooded");
    assert!(!m.log_text().contains("panicked"), "{}", m.log_text());
    m.stop();
    assert!(!sock.exists(), "the control socket outlived the daemon");
}

#[test]
fn the_socket_is_private_single_and_cleaned_up() {
    let d = Dirs::new(&[("f", b"hello")]);
    let m = d.mount(&["--no-remote"]);
    let mnt = d.mnt.to_str().unwrap();
    // As root, the default socket lives in /run/farcache, a private directory.
    let dir = fs::symlink_metadata("/run/farcache").unwrap();
    assert!(dir.is_dir());
    assert_eq!(dir.permissions().mode() & 0o077, 0, "{:o}", dir.permissions().mode());
    let ping = json(&["stats", mnt]);
    assert!(ping["backing"].is_object(), "{ping:#}");
    let sock = socket_of(&m);
    assert_eq!(sock.parent().unwrap(), Path::new("/run/farcache"));
    let name = sock.file_name().unwrap().to_str().unwrap();
    assert!(name.ends_with(&format!("{}.sock", d.mnt.file_name().unwrap().to_str().unwrap())), "{name}");
    assert!(sock.as_os_str().len() <= 107);
    assert_eq!(fs::symlink_metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);

    // Without a remote tier there are no lenders to change.
    let out = farcache(&["lenders", mnt, "--add", "127.0.0.1:7411"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no remote tier"), "{}", text(&out.stderr));
    assert_eq!(lenders(&d.mnt, &[]), Value::Array(vec![]));

    // Another user: kept out by the directory and the socket's mode...
    let as_nobody = |args: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.args(args).uid(65534).gid(65534);
        run_with_timeout(cmd, CMD_TIMEOUT).unwrap()
    };
    let out = as_nobody(&["stats", "--control-socket", sock.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("only its owner and root may"), "{}", text(&out.stderr));
    // ...and by the daemon itself, should the mode be opened up.
    let open_dir = tempfile::tempdir().unwrap();
    fs::set_permissions(open_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let d2 = Dirs::new(&[]);
    let sock2 = open_dir.path().join("open.sock");
    let m2 = d2.mount(&["--no-remote", "--control-socket", sock2.to_str().unwrap()]);
    fs::set_permissions(&sock2, fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&["stats", "--control-socket", sock2.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("uid 65534 may not control this mount"), "{}", text(&out.stderr));
    m2.stop();

    // A second daemon for the same mount point is refused before it mounts anything.
    // (Not through MountProcess: it would take the first mount for the second's.)
    let out = farcache(&["mount", d.backing.to_str().unwrap(), mnt, "--no-remote"]);
    assert!(!out.status.success(), "a second mount on a live mount point started");
    let e = text(&out.stderr);
    assert!(e.contains("another farcache mount answers"), "{e}");
    assert!(json(&["stats", mnt])["backing"].is_object(), "the first one still answers");

    // Killed: the socket stays behind, stale; the next mount replaces it.
    m.signal(libc::SIGKILL);
    m.wait_exit();
    assert!(sock.exists());
    assert!(!farcache(&["stats", mnt]).status.success());
    let _ = run_with_timeout(
        {
            let mut c = Command::new("fusermount3");
            c.arg("-u").arg(&d.mnt);
            c
        },
        CMD_TIMEOUT,
    );
    drop(m);
    let m = d.mount(&["--no-remote"]);
    assert!(m.log_text().contains("removing stale control socket"), "{}", m.log_text());
    assert!(json(&["stats", mnt])["backing"].is_object());
    // Unmounted by someone else: the daemon exits and takes its socket with it.
    let out = run_with_timeout(
        {
            let mut c = Command::new("fusermount3");
            c.arg("-u").arg(&d.mnt);
            c
        },
        CMD_TIMEOUT,
    )
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(m.wait_exit(), 0, "{}", m.log_text());
    assert!(!sock.exists(), "socket left behind after unmount");
}

#[test]
fn a_detached_mount_frees_its_socket_for_the_next_one() {
    let d = Dirs::new(&[("f", b"held open")]);
    let cfg = d.root.path().join("grace.toml");
    fs::write(&cfg, "[mount]\nshutdown_grace = \"20s\"\n").unwrap();
    let old = d.mount(&["--no-remote", "--config", cfg.to_str().unwrap()]);
    let sock = socket_of(&old);
    let held = File::open(d.mnt.join("f")).unwrap();
    // Busy: SIGTERM detaches the mount, and the daemon waits for its user...
    old.signal(libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(20), || !sock.exists()),
        "the detached daemon kept its control socket:\n{}",
        old.log_text()
    );
    // ...while a new mount takes the mount point, and its socket.
    let log2 = d.root.path().join("new.log");
    let new = MountProcess::start(bin(), &d.backing, &d.mnt, &["--no-remote"], &log2);
    assert_eq!(socket_of(&new), sock);
    let st = json(&["stats", d.mnt.to_str().unwrap()]);
    assert_eq!(st["pid"].as_u64(), Some(new.pid() as u64), "{st:#}");
    let mut s = String::new();
    (&held).read_to_string(&mut s).unwrap();
    assert_eq!(s, "held open");
    drop(held);
    assert_eq!(old.wait_exit(), 0, "{}", old.log_text());
    assert!(sock.exists(), "the old daemon removed the new one's socket");
    new.stop();
    assert!(!sock.exists());
}
