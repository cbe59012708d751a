//! `make run`'s script, scripts/run-demo.sh, run for real with tiny sizes (DEMO_SIZE,
//! DEMO_READ) against the binary under test: as root it builds the emulated slow disk (loop
//! device, ext4, blkio throttle), runs passthrough and farcache from cold starts, and prints
//! the side-by-side table with farcache ÷ passthrough per pass and the farcache mount's stats;
//! every read the passthrough mount made went through the throttled cgroup; nothing is left
//! behind — no loop device on its image, no mount, no cgroup, no work directory — also when
//! it is interrupted (SIGINT to its process group, as Ctrl-C sends) in the middle of a run.
//! `DEMO_SLOW_DISK=0` (and a missing prerequisite) gives the plain-disk run with its caption.
//! And `farcache randread --json --verify`, which the script parses, on plain files.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/run-demo.sh")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A work area on the real disk (the script's loop device image cannot live on tmpfs),
/// removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("run-demo-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn out(&self) -> PathBuf {
        self.0.join("output")
    }
    /// Where the script puts its work directory.
    fn demo_dir(&self) -> PathBuf {
        self.0.join("demo")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Start the script with `env` (stdout and stderr together in `dir.out()`), in a process group
/// of its own so that a signal to the group reaches it and its children as Ctrl-C would.
fn start(dir: &Scratch, env: &[(&str, &str)]) -> Child {
    std::fs::create_dir_all(dir.demo_dir()).unwrap();
    let out = std::fs::File::create(dir.out()).unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .env("BIN", bin())
        .env("DEMO_DIR", dir.demo_dir())
        .env_remove("DEMO_SLOW_DISK")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn().unwrap()
}

fn output(dir: &Scratch) -> String {
    std::fs::read_to_string(dir.out()).unwrap_or_default()
}

/// Wait for the script to end, at most `limit`; past it, SIGTERM (the script cleans up on
/// it), then SIGKILL, and fail.
fn wait(child: &mut Child, dir: &Scratch, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(15));
            let _ = child.kill();
            let _ = child.wait();
            panic!("run-demo.sh ran over {limit:?}; output:\n{}", output(dir));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Nothing of the script's run is left: no loop device on an image under the scratch
/// directory, no mount under it, no blkio cgroup of the script's pid, no work directory.
fn assert_clean(dir: &Scratch, pid: u32, out: &str) {
    let root = dir.0.to_string_lossy().to_string();
    if is_root() {
        let losetup = Command::new("losetup").arg("-a").output().unwrap();
        let loops = String::from_utf8_lossy(&losetup.stdout);
        assert!(!loops.contains(&root), "loop device left behind:\n{loops}\noutput:\n{out}");
        assert!(
            !Path::new(&format!("/sys/fs/cgroup/blkio/farcache-demo-{pid}")).exists(),
            "blkio cgroup farcache-demo-{pid} left behind; output:\n{out}"
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&root), "mount left behind:\n{mounts}\noutput:\n{out}");
    let left: Vec<_> = std::fs::read_dir(dir.demo_dir()).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "work directory left behind: {left:?}; output:\n{out}");
    // No daemon of this run survives: the mount points were inside the work directory.
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(!ps.lines().any(|l| l.contains(&root) && !l.contains("run-demo")), "a process of the run is left:\n{ps}");
}

/// The numbers of the table row that starts with `label`: 4 per pass (time, reads/s, p50,
/// p99) for a configuration, 2 for the ratio row.
fn row(out: &str, label: &str) -> Vec<f64> {
    let line = out
        .lines()
        .find(|l| l.split_once('|').is_some_and(|(head, _)| head.trim() == label))
        .unwrap_or_else(|| panic!("no table row {label:?} in:\n{out}"));
    line.split('|')
        .skip(1)
        .flat_map(|cell| cell.split_whitespace())
        .filter_map(|w| w.trim_end_matches(['s', 'x']).parse::<f64>().ok())
        .collect()
}

fn assert_table(out: &str, reads: u64) {
    assert!(
        out.contains(&format!("== results: {reads} reads of 4 KiB per pass")),
        "no results header for {reads} reads:\n{out}"
    );
    for cfg in ["passthrough", "farcache"] {
        let v = row(out, cfg);
        assert_eq!(v.len(), 8, "row {cfg}: {v:?}\n{out}");
        for pass in 0..2 {
            let (secs, rate) = (v[4 * pass], v[4 * pass + 1]);
            assert!(secs > 0.0 && rate > 0.0, "row {cfg} pass {}: {v:?}\n{out}", pass + 1);
            // time × reads/s = the reads of a pass (the time is printed to 10 ms).
            let implied = secs * rate;
            assert!(
                (implied - reads as f64).abs() <= 0.02 * reads as f64 + rate * 0.006,
                "row {cfg} pass {}: {secs} s at {rate}/s is not {reads} reads\n{out}",
                pass + 1
            );
        }
    }
    let ratio = row(out, "farcache ÷ passthrough");
    assert_eq!(ratio.len(), 2, "ratio row: {ratio:?}\n{out}");
    let (pt, fc) = (row(out, "passthrough"), row(out, "farcache"));
    for pass in 0..2 {
        let want = fc[4 * pass + 1] / pt[4 * pass + 1];
        assert!((ratio[pass] - want).abs() <= 0.01 + 0.01 * want, "ratio of pass {}: {ratio:?}\n{out}", pass + 1);
    }
    assert!(out.contains("(> 1: farcache faster)"), "{out}");
    // `farcache stats MNT` of the farcache mount, with its embedded lender.
    assert!(out.contains("stats ") && out.contains("a lender inside the mount process"), "no stats:\n{out}");
}

#[test]
fn the_demo_compares_both_configurations_on_a_slow_disk_and_cleans_up() {
    let dir = Scratch::new("full");
    // 1 MiB per pass: 256 reads of 4 KiB, about 0.1 s a pass on the throttled disk.
    let mut child = start(&dir, &[("DEMO_SIZE", "16"), ("DEMO_READ", "1MiB")]);
    let pid = child.id();
    let status = wait(&mut child, &dir, Duration::from_secs(60));
    let out = output(&dir);
    assert_clean(&dir, pid, &out);
    if !is_root() {
        assert!(out.contains("no emulated slow disk: not root (uid"), "{out}");
        return;
    }
    assert!(status.success(), "run-demo.sh failed ({status}):\n{out}");
    assert!(out.contains("== the slow disk: /dev/loop"), "no slow disk as root:\n{out}");
    assert!(out.contains("capped by blkio at 3000 IOPS and 125 MB/s"), "{out}");
    assert!(!out.contains("not expected to win"), "the plain-disk caption on the slow disk:\n{out}");
    assert_table(&out, 256);
    // Every read the passthrough daemon made (256 per pass, O_DIRECT) went through the
    // throttled cgroup: the daemon really ran inside it.
    assert!(
        out.contains("Reads the slow disk served to the mount daemon, both passes: passthrough 512,"),
        "the cgroup did not see every read of the passthrough mount:\n{out}"
    );
    assert!(out.contains("done in "), "{out}");
}

#[test]
fn the_plain_disk_fallback_says_why_and_what_to_expect() {
    let dir = Scratch::new("plain");
    let mut child = start(&dir, &[("DEMO_SIZE", "8"), ("DEMO_READ", "512KiB"), ("DEMO_SLOW_DISK", "0")]);
    let pid = child.id();
    let status = wait(&mut child, &dir, Duration::from_secs(60));
    let out = output(&dir);
    assert_clean(&dir, pid, &out);
    assert!(out.contains("== no emulated slow disk: DEMO_SLOW_DISK=0 asked for the plain disk"), "{out}");
    assert!(
        out.contains(
            "This disk is faster than the embedded lender's round trip, so farcache is not expected to win \
             here; see BENCHMARKS.md."
        ),
        "no honest caption:\n{out}"
    );
    if !is_root() {
        // Without root the mount itself may be refused (/dev/fuse); the reason was said.
        return;
    }
    assert!(status.success(), "run-demo.sh failed ({status}):\n{out}");
    assert_table(&out, 128);
}

#[test]
fn an_interrupted_demo_leaves_nothing_behind() {
    if !is_root() {
        return; // nothing but files to leave behind; the other tests cover them
    }
    let dir = Scratch::new("interrupt");
    // Long enough to be in the middle of the passthrough's reads when the signal comes.
    let mut child = start(&dir, &[("DEMO_SIZE", "64"), ("DEMO_READ", "256MiB")]);
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(40);
    while !output(&dir).contains("randread ") {
        assert!(Instant::now() < deadline, "the reads did not start in 40 s:\n{}", output(&dir));
        assert!(child.try_wait().unwrap().is_none(), "run-demo.sh ended early:\n{}", output(&dir));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // Ctrl-C: SIGINT to the whole process group (the script, the mount daemon, the reader).
    // SAFETY: a signal to the process group of our own child, which leads it.
    unsafe { libc::kill(-(pid as i32), libc::SIGINT) };
    let t = Instant::now();
    let status = wait(&mut child, &dir, Duration::from_secs(40));
    let out = output(&dir);
    assert_eq!(status.code(), Some(130), "exit status after SIGINT:\n{out}");
    assert!(t.elapsed() < Duration::from_secs(20), "cleanup took {:?}:\n{out}", t.elapsed());
    assert!(out.contains("run-demo: stopped (exit 130); cleaned up"), "{out}");
    assert!(!out.contains("== results"), "the run was not interrupted in the middle:\n{out}");
    assert_clean(&dir, pid, &out);
}

/// What the script relies on from `farcache randread`: `--json` puts one JSON object on
/// stdout with both passes (the human lines on stderr), and `--verify` fails on a wrong byte
/// even though it compares only after the timed pass.
#[test]
fn randread_reports_json_and_catches_a_wrong_byte() {
    let dir = Scratch::new("randread");
    let data: Vec<u8> = (0..64 * 4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let (a, b) = (dir.0.join("a.bin"), dir.0.join("b.bin"));
    std::fs::write(&a, &data).unwrap();
    std::fs::write(&b, &data).unwrap();
    let run = |verify: &Path| {
        Command::new(bin())
            .arg("randread")
            .arg(&a)
            .args(["--size", "256KiB", "--passes", "2", "--json", "--verify"])
            .arg(verify)
            .output()
            .unwrap()
    };
    let ok = run(&b);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).expect("one JSON object on stdout");
    assert_eq!(v["reads_per_pass"], 64);
    assert_eq!(v["verified"], true);
    let passes = v["passes"].as_array().unwrap();
    assert_eq!(passes.len(), 2);
    for (i, p) in passes.iter().enumerate() {
        assert_eq!(p["pass"], i as u64 + 1);
        assert!(p["secs"].as_f64().unwrap() > 0.0 && p["reads_per_sec"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["p50_us"].as_u64().is_some() && p["p99_us"].as_u64().is_some(), "{p}");
    }
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(err.contains("pass 2:") && err.contains("every block verified"), "{err}");

    // One byte of the other copy changed in every block: whichever blocks the random
    // sequence drew, a wrong byte is an error.
    let mut bad = data.clone();
    for blk in 0..64 {
        bad[blk * 4096 + 1234] ^= 0x40;
    }
    std::fs::write(&b, &bad).unwrap();
    let fail = run(&b);
    assert!(!fail.status.success(), "a wrong byte passed verification");
    let err = String::from_utf8_lossy(&fail.stderr);
    assert!(err.contains("pass 1: the 4096 bytes read at offset") && err.contains("differ from"), "{err}");
}
