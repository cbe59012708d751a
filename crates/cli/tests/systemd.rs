//! systemd: the unit files in etc/systemd verify with `systemd-analyze` (which runs without
//! systemd as PID 1: it loads and checks the units offline), keep their sandboxing, name only
//! flags the binary has, and the real daemons tell a `$NOTIFY_SOCKET` `READY=1` once they
//! serve and `STOPPING=1` when told to stop.
//!
//! `systemd-analyze` comes with the `systemd` package (scripts/deps.sh installs it). The
//! mount test needs root and FUSE.

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use farcache_testkit::{require_root, run_with_timeout, text, MountProcess, ServerProcess};

const SERVER_UNIT: &str = include_str!("../../../etc/systemd/farcache-server.service");
const MOUNT_UNIT: &str = include_str!("../../../etc/systemd/farcache-mount@.service");
/// Where the units expect the binary; the tests point them at the one under test.
const INSTALLED: &str = "/usr/local/bin/farcache";

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

/// The units, their binary path replaced by the test binary's, in `dir`; the mount template
/// also as an instance (`mnt-data`: mounts on /mnt/data), which is what systemd loads.
fn write_units(dir: &Path) -> (PathBuf, PathBuf) {
    let b = bin().to_str().unwrap();
    let server = dir.join("farcache-server.service");
    fs::write(&server, SERVER_UNIT.replace(INSTALLED, b)).unwrap();
    let mount = MOUNT_UNIT.replace(INSTALLED, b);
    fs::write(dir.join("farcache-mount@.service"), &mount).unwrap();
    let instance = dir.join("farcache-mount@mnt-data.service");
    fs::write(&instance, &mount).unwrap();
    (server, instance)
}

fn systemd_analyze(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("systemd-analyze");
    cmd.args(args);
    run_with_timeout(cmd, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("systemd-analyze {args:?}: {e} (install systemd: scripts/deps.sh does)"))
}

/// `Key=value` settings of a unit's `[Service]` section, in order.
fn service_settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .skip_while(|l| *l != "[Service]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect()
}

#[test]
fn the_units_verify_and_keep_their_sandboxing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, mount) = write_units(dir.path());
    for unit in [&server, &mount] {
        let u = unit.to_str().unwrap();
        let out = systemd_analyze(&["verify", u]);
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        // verify reports unknown keys and bad values as warnings and exits 0: any word is a
        // finding.
        assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify {u}:\n{said}");
    }
    // The exposure score (0 to 10, as tenths for --threshold): the lender is locked down;
    // the mount cannot be (see its comment), but must not lose what it has.
    for (unit, most) in [(&server, "20"), (&mount, "60")] {
        let u = unit.to_str().unwrap();
        let out = systemd_analyze(&["security", "--offline=true", &format!("--threshold={most}"), u]);
        assert!(out.status.success(), "{u} is more exposed than {most}/100:\n{}", text(&out.stdout));
    }

    let (s, m) = (service_settings(SERVER_UNIT), service_settings(MOUNT_UNIT));
    let has = |set: &[(String, String)], k: &str, v: &str| set.iter().any(|(a, b)| a == k && b == v);
    assert!(has(&s, "Type", "notify") && has(&s, "NotifyAccess", "main"), "{s:?}");
    // The mount's main process is the supervisor; the daemon it runs notifies.
    assert!(has(&m, "Type", "notify") && has(&m, "NotifyAccess", "all"), "{m:?}");
    assert!(m.iter().any(|(k, v)| k == "ExecStart" && v.contains("--supervise")), "{m:?}");
    assert!(m.iter().any(|(k, v)| k == "ExecReload" && v.contains("-HUP")), "{m:?}");
    assert!(has(&s, "User", "farcache") && has(&s, "CapabilityBoundingSet", ""), "{s:?}");
    assert!(has(&m, "DeviceAllow", "/dev/fuse rw"), "the mount needs /dev/fuse: {m:?}");
    assert!(m.iter().any(|(k, v)| k == "CapabilityBoundingSet" && v.contains("CAP_SYS_ADMIN")), "{m:?}");
    // Any of these gives the service its own mount namespace, where the FUSE mount would be
    // invisible to the rest of the machine.
    for k in [
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "PrivateMounts",
        "PrivateUsers",
        "ReadOnlyPaths",
        "ReadWritePaths",
        "InaccessiblePaths",
        "TemporaryFileSystem",
        "BindPaths",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectProc",
        "MountFlags",
    ] {
        assert!(!m.iter().any(|(a, _)| a == k), "{k}= in the mount unit would hide its mount");
    }

    // Every flag the units pass exists.
    for (sub, unit) in [("server", SERVER_UNIT), ("mount", MOUNT_UNIT)] {
        let help = text(&farcache_testkit::run_bin(bin(), &[sub, "--help"]).stdout);
        let exec = service_settings(unit).into_iter().find(|(k, _)| k == "ExecStart").unwrap().1;
        for flag in exec.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(help.contains(flag), "{exec}: `farcache {sub}` has no {flag}");
        }
    }
    let env = include_str!("../../../etc/systemd/farcache-mount.env.example");
    let args = env.lines().find_map(|l| l.strip_prefix("FARCACHE_ARGS=")).expect("FARCACHE_ARGS in the example");
    let help = text(&farcache_testkit::run_bin(bin(), &["mount", "--help"]).stdout);
    for flag in args.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "farcache-mount.env.example: `farcache mount` has no {flag}");
    }
}

/// A socket standing in for systemd's notification socket.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    sock: UnixDatagram,
}

impl NotifySocket {
    fn new() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        NotifySocket { _dir: dir, path, sock }
    }

    fn env(&self) -> (&'static str, &str) {
        ("NOTIFY_SOCKET", self.path.to_str().unwrap())
    }

    /// The next message, which must come within the read timeout.
    fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self.sock.recv(&mut buf).expect("no notification within 20 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

#[test]
fn the_server_says_ready_once_it_listens_and_stopping_on_sigterm() {
    let n = NotifySocket::new();
    let mut srv = ServerProcess::start_env(bin(), &["--capacity", "16MiB"], None, &[n.env()]);
    let ready = n.next();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.lines().any(|l| l == format!("MAINPID={}", srv.pid())), "{ready:?}");
    assert!(ready.contains(&format!("STATUS=lending 16MiB on {}", srv.addr())), "{ready:?}");
    // Ready means ready: a client connects at once.
    assert!(std::net::TcpStream::connect(srv.addr()).is_ok());
    let st = srv.terminate(Duration::from_secs(10)).expect("the server stops on SIGTERM");
    assert!(st.success(), "{st}");
    assert!(n.next().lines().any(|l| l == "STOPPING=1"));
}

#[test]
fn the_mount_says_ready_once_mounted_and_stopping_when_it_unmounts() {
    require_root("the mount readiness test");
    let n = NotifySocket::new();
    let root = tempfile::tempdir().unwrap();
    let (backing, mnt) = (root.path().join("b"), root.path().join("m"));
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(backing.join("f"), b"hello").unwrap();
    let log = root.path().join("mount.log");
    let m = MountProcess::try_start_env(bin(), &backing, &mnt, &["--no-remote"], &[n.env()], &log)
        .unwrap_or_else(|e| panic!("{e}"));
    let ready = n.next();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.lines().any(|l| l == format!("MAINPID={}", m.pid())), "{ready:?}");
    assert_eq!(fs::read(mnt.join("f")).unwrap(), b"hello", "ready, so serving");
    m.stop();
    assert!(n.next().lines().any(|l| l == "STOPPING=1"));

    // Supervised (as the unit runs it): the daemon, a child, names the supervisor as the main
    // process, so that systemd leaves the daemon's crashes to the supervisor.
    let log = root.path().join("supervised.log");
    let m = MountProcess::try_start_env(bin(), &backing, &mnt, &["--no-remote", "--supervise"], &[n.env()], &log)
        .unwrap_or_else(|e| panic!("{e}"));
    // (The first daemon's last STOPPING=1 lines may come first.)
    let ready = (0..5).map(|_| n.next()).find(|s| s.contains("READY=1")).expect("READY=1 from the supervised daemon");
    assert!(ready.lines().any(|l| l == format!("MAINPID={}", m.pid())), "{ready:?}");
    m.stop();
}
