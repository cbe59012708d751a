//! A mount of several backing branches with a write-back tier (`farcache mount DIR1:DIR2
//! MOUNTPOINT --tier PATH`), with the real binary and real FUSE mounts: files whose data is
//! only in the tier (acknowledged, not yet written back) moved by `farcache balance` — the
//! copy takes those blocks from the tier, the balance counts them —, written again after the
//! move, the daemon SIGKILLed and remounted with the tier, and the tier written back to the
//! branch each file lives on now; a SIGKILL at each step of such a move, with a plain daemon
//! and under `--supervise`; a supervised union with a tier across kills, a move and an
//! upgrade, with a descriptor held throughout; and a `--takeover` of one.
//!
//! Branch `a` is on the test directory's disk file system, `b` on tmpfs (`/dev/shm`); the
//! tier is a file on tmpfs (`dram`: it survives the daemon). The tier is kept from writing
//! back on its own (`idle_destage_after = 0`, a long `max_dirty_age`), so the data moved is
//! the tier's alone until a flush or a clean unmount. These tests need root and FUSE.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use farcache_testkit::{pattern, require_root, run_bin, text, wait_until, MountProcess, TierFile, UnionDirs};
use serde_json::Value;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farcache"))
}

struct Dirs {
    d: UnionDirs,
    tier: TierFile,
    config: String,
}

impl Dirs {
    fn new(tag: &str) -> Dirs {
        require_root("the union tier tests");
        let d = UnionDirs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), &format!("ut-{tag}"));
        let config = d.root.join("farcache.toml");
        // New files on the first branch; the tier writes back only when asked to.
        fs::write(
            &config,
            "[mount]\ncreate_policy = \"first\"\n[tier]\nidle_destage_after = \"0s\"\nmax_dirty_age = \"10m\"\n",
        )
        .unwrap();
        Dirs { d, tier: TierFile::new(&format!("ut-{tag}")), config: config.display().to_string() }
    }

    fn args(&self, tier: bool) -> Vec<&str> {
        let mut a = vec!["--no-remote", "--config", &self.config];
        if tier {
            a.extend(["--tier", self.tier.arg(), "--tier-size", "64MiB"]);
        }
        a
    }

    fn try_mount(&self, tier: bool, env: &[(&str, &str)]) -> Result<MountProcess, String> {
        let log = self.d.root.join("daemon.log");
        MountProcess::try_start_env(bin(), &self.d.branches(), &self.d.mnt, &self.args(tier), env, &log)
    }

    fn mount(&self) -> MountProcess {
        self.try_mount(true, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    fn m(&self, rel: &str) -> std::path::PathBuf {
        self.d.m(rel)
    }

    /// On which branches `rel` exists.
    fn on(&self, rel: &str) -> (bool, bool) {
        (self.d.a.join(rel).symlink_metadata().is_ok(), self.d.b.join(rel).symlink_metadata().is_ok())
    }

    /// The file `rel` as it is on the branch it is on (below the mount, and the tier).
    fn on_disk(&self, rel: &str) -> Vec<u8> {
        let (a, b) = self.on(rel);
        assert!(a != b, "{rel} is on {:?} (a, b): not exactly once", (a, b));
        fs::read(if a { self.d.a.join(rel) } else { self.d.b.join(rel) }).unwrap()
    }

    fn balance(&self, extra: &[&str]) -> Output {
        self.d.balance(bin(), extra)
    }

    /// `farcache balance` that must succeed: its final status.
    fn balanced(&self, extra: &[&str]) -> Value {
        self.d.balanced(bin(), extra)
    }

    fn stats(&self) -> Value {
        self.d.stats(bin())
    }

    fn flush(&self) {
        let out = run_bin(bin(), &["flush", self.d.mnt.to_str().unwrap()]);
        assert!(out.status.success(), "flush: {}", text(&out.stderr));
    }

    fn log(&self) -> String {
        fs::read_to_string(self.d.root.join("daemon.log")).unwrap_or_default()
    }
}

fn n(v: &Value, section: &str, field: &str) -> u64 {
    v[section][field].as_u64().unwrap_or_else(|| panic!("no {section}.{field} in {v:#}"))
}

/// Write `data` as the whole of `path` through the mount, synced (acknowledged by the tier).
fn write_synced(path: &Path, data: &[u8]) {
    let f = OpenOptions::new().create(true).truncate(true).write(true).open(path).unwrap();
    f.write_all_at(data, 0).unwrap();
    f.sync_data().unwrap();
}

/// Overwrite `data` at `off` of `path` through the mount, synced, and in `model`.
fn overwrite(path: &Path, model: &mut [u8], off: usize, data: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off as u64).unwrap();
    f.sync_data().unwrap();
    model[off..off + data.len()].copy_from_slice(data);
}

fn blocks(len: usize) -> u64 {
    len.div_ceil(4096) as u64
}

#[test]
fn files_with_dirty_tier_data_move_and_stay_whole_across_a_kill_and_remounts() {
    let d = Dirs::new("move");
    let m = d.mount();
    // Four files whose data is in the tier only (short last blocks included).
    let mut files: Vec<(String, Vec<u8>)> =
        (0..4).map(|i| (format!("f{i}"), pattern(300_000 + i * 5_000 + 123, 40 + i as u64))).collect();
    for (p, data) in &files {
        write_synced(&d.m(p), data);
    }
    let total: u64 = files.iter().map(|(_, data)| blocks(data.len())).sum();
    let st = d.stats();
    assert!(n(&st, "tier", "dirty_blocks") >= total, "the data is not dirty in the tier: {st:#}");
    for (p, data) in &files {
        assert_eq!(d.on(p), (true, false), "{p}");
        assert_ne!(&d.on_disk(p), data, "{p}: already written back; the test would prove nothing");
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p}"); // and recently used
    }
    let inos: Vec<u64> = files.iter().map(|(p, _)| fs::metadata(d.m(p)).unwrap().ino()).collect();

    // The move takes every block from the tier: the source disk lacks them.
    let s = d.balanced(&["--from", "0", "--to", "1", "--files", "4"]);
    assert_eq!((s["moved"].as_u64(), s["failed"].as_u64()), (Some(4), Some(0)), "{s:#}");
    assert_eq!(s["blocks_from_tier"].as_u64(), Some(total), "{s:#}");
    assert_eq!(s["blocks_from_cache"].as_u64(), Some(total), "tier blocks count as the cache's: {s:#}");
    assert_eq!(s["blocks_from_disk"].as_u64(), Some(0), "{s:#}");
    for ((p, data), ino) in files.iter().zip(&inos) {
        assert_eq!(d.on(p), (false, true), "{p}");
        assert_eq!(&d.on_disk(p), data, "{p}: the copy on the target lacks the tier's data");
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p}");
        assert_eq!(fs::metadata(d.m(p)).unwrap().ino(), *ino, "{p}: inode number after the move");
    }
    let st = d.stats();
    assert_eq!(n(&st, "union", "blocks_from_tier"), total, "{st:#}");

    // Written again after the move (dirty in the tier once more), then the daemon dies.
    let (p0, model0) = &mut files[0];
    overwrite(&d.m(p0), model0, 3 * 4096 + 100, &pattern(5_000, 99));
    // Written back by this daemon: to the file's new branch, not to the copy it left.
    d.flush();
    assert_eq!(&d.on_disk(&files[0].0), &files[0].1, "written back elsewhere than the file's branch");
    let (p0, model0) = &mut files[0];
    overwrite(&d.m(p0), model0, 100, &pattern(300, 96));
    let (p1, model1) = &mut files[1];
    let end = model1.len();
    overwrite(&d.m(p1), model1, end - 10, &pattern(10, 98));
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit_timeout(Duration::from_secs(20)).is_some(), "the daemon did not die");
    drop(m);

    // Both branches are marked: a mount without the tier refuses them.
    let e = d.try_mount(false, &[]).err().expect("mounted without the tier over a dirty tier's branches");
    assert!(e.contains("tier") && e.contains("fix"), "{e}");

    // Remounted with the tier: every acknowledged byte, and the write-back goes to the
    // branch each file lives on now.
    let m = d.mount();
    for ((p, data), ino) in files.iter().zip(&inos) {
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p} after the kill");
        assert_eq!(fs::metadata(d.m(p)).unwrap().ino(), *ino, "{p}: inode number after the kill");
    }
    d.flush();
    for (p, data) in &files {
        assert_eq!(d.on(p), (false, true), "{p}");
        assert_eq!(&d.on_disk(p), data, "{p}: written back elsewhere than its branch");
    }

    // Partly dirty now, moved back from the disk (`--source disk`): the tier's blocks still
    // come from the tier (the disk lacks them), the rest from the disk.
    let (p2, model2) = &mut files[2];
    overwrite(&d.m(p2), model2, 8 * 4096, &pattern(2 * 4096, 97));
    fs::read(d.m(p2)).unwrap();
    let s = d.balanced(&["--from", "1", "--to", "0", "--files", "1", "--source", "disk"]);
    assert_eq!(s["moved"].as_u64(), Some(1), "{s:#}");
    assert_eq!(s["blocks_from_tier"].as_u64(), Some(2), "{s:#}");
    assert_eq!(s["blocks_from_disk"].as_u64(), Some(blocks(files[2].1.len()) - 2), "{s:#}");
    assert_eq!(d.on(&files[2].0), (true, false));
    for (p, data) in &files {
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p} after the second move");
    }

    // A clean unmount writes everything back where each file is and unmarks both branches.
    m.stop();
    for ((p, data), ino) in files.iter().zip(&inos) {
        assert_eq!(&d.on_disk(p), data, "{p} after a clean unmount");
        let _ = ino;
    }
    let m = d.try_mount(false, &[]).unwrap_or_else(|e| panic!("clean, yet refused without the tier: {e}"));
    for ((p, data), ino) in files.iter().zip(&inos) {
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p} without the tier");
        assert_eq!(fs::metadata(d.m(p)).unwrap().ino(), *ino, "{p}: inode number after remounts");
    }
    m.stop();

    // Dirty again, the daemon killed: the refusal names the union's `tier recover`, which
    // writes the tier back offline to each file's branch.
    let m = d.mount();
    let (p3, model3) = &mut files[3];
    overwrite(&d.m(p3), model3, 4096, &pattern(4096, 95));
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit_timeout(Duration::from_secs(20)).is_some(), "the daemon did not die");
    drop(m);
    let branches = d.d.branches().display().to_string();
    let e = d.try_mount(false, &[]).err().expect("mounted without the tier over a dirty tier's branches");
    assert!(e.contains(&format!("farcache tier recover {} {branches}", d.tier.arg())), "{e}");
    let out = run_bin(bin(), &["tier", "recover", d.tier.arg(), &branches]);
    assert!(out.status.success(), "tier recover: {}{}", text(&out.stdout), text(&out.stderr));
    for (p, data) in &files {
        assert_eq!(&d.on_disk(p), data, "{p} after tier recover");
    }
    let m = d.try_mount(false, &[]).unwrap_or_else(|e| panic!("recovered, yet refused without the tier: {e}"));
    for (p, data) in &files {
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{p} without the tier, after tier recover");
    }
    m.stop();
}

#[test]
fn a_kill_at_each_step_of_a_move_with_dirty_tier_data_loses_nothing() {
    for step in ["before-copy", "mid-copy", "after-copy", "after-switch", "before-remove"] {
        let d = Dirs::new(&format!("kill-{step}"));
        let fault = format!("balance:{step}");
        let m = d.try_mount(true, &[("FARCACHE_FAULT", &fault)]).unwrap_or_else(|e| panic!("{e}"));
        let data = pattern((1 << 20) + 777, 61);
        // Written under another name, then renamed: the tier's record of its path is stale,
        // so after the switch only what the move declared to the tier finds it.
        write_synced(&d.m("f0"), &data);
        fs::rename(d.m("f0"), d.m("f")).unwrap();
        // A second file, dirty too, that no move touches.
        let other = pattern(50_000, 62);
        write_synced(&d.m("g"), &other);
        assert_eq!(fs::read(d.m("f")).unwrap(), data);
        let ino = fs::metadata(d.m("f")).unwrap().ino();
        assert!(n(&d.stats(), "tier", "dirty_blocks") >= blocks(data.len()), "{step}: not dirty in the tier");
        assert_ne!(d.on_disk("f"), data, "{step}: written back already");
        let out = d.balance(&["--from", "0", "--to", "1", "--files", "1"]);
        assert!(!out.status.success(), "{step}: the daemon did not stop at the fault point");
        assert!(m.wait_exit_timeout(Duration::from_secs(20)).is_some(), "{step}: the daemon did not die");
        drop(m);
        assert!(d.log().contains(&fault), "{step}: the fault point was not reached");

        let m = d.mount();
        // The tier found both files where the replayed move left them (it did not take the
        // moved one for deleted, dropping its records and relying on the copy alone).
        let log = m.log_text();
        assert!(
            log.contains("of 2 files recovered and served from the tier") && !log.contains("was deleted after"),
            "{step}: recovery did not find both files:\n{log}"
        );
        let (a, b) = d.on("f");
        assert!(a != b, "{step}: the file is on {:?} (a, b): not exactly once", (a, b));
        let switched = matches!(step, "after-switch" | "before-remove");
        assert_eq!(b, switched, "{step}: on the target only once the switch happened");
        assert_eq!(fs::read(d.m("f")).unwrap(), data, "{step}: the newest acknowledged data");
        assert_eq!(fs::read(d.m("g")).unwrap(), other, "{step}");
        assert_eq!(fs::metadata(d.m("f")).unwrap().ino(), ino, "{step}");
        for br in [&d.d.a, &d.d.b] {
            let left = |sub: &str| fs::read_dir(br.join(".farcache-union").join(sub)).unwrap().count();
            assert_eq!((left("tmp"), left("journal")), (0, 0), "{step}: a copy or a record was left");
        }
        d.flush();
        assert_eq!(d.on_disk("f"), data, "{step}: written back elsewhere than the file's branch");
        assert_eq!(d.on_disk("g"), other, "{step}");
        m.stop();
    }
}

/// The daemon a supervisor runs: its one child other than `not` (bounded wait).
fn daemon_of(sup: &MountProcess, not: Option<u32>) -> u32 {
    let mut pid = None;
    let ok = wait_until(Duration::from_secs(30), Duration::from_millis(5), || {
        let c = sup.children();
        pid = (c.len() == 1 && Some(c[0]) != not).then(|| c[0]);
        pid.is_some()
    });
    assert!(ok, "no single new daemon under the supervisor (children {:?}):\n{}", sup.children(), sup.log_text());
    pid.unwrap()
}

/// Everything read back through the mount and through `held` (a descriptor of `files[0]`
/// opened before whatever happened), against the models.
fn check(d: &Dirs, held: &std::fs::File, files: &[(String, Vec<u8>)], inos: &[u64], what: &str) {
    for ((p, data), ino) in files.iter().zip(inos) {
        assert_eq!(&fs::read(d.m(p)).unwrap(), data, "{what}: {p}");
        assert_eq!(fs::metadata(d.m(p)).unwrap().ino(), *ino, "{what}: {p}'s inode number");
    }
    let mut back = vec![0u8; files[0].1.len()];
    held.read_exact_at(&mut back, 0).unwrap_or_else(|e| panic!("{what}: a held descriptor: {e}"));
    assert!(back == files[0].1, "{what}: read through a descriptor held across");
}

#[test]
fn a_supervised_union_with_a_tier_keeps_its_dirty_data_across_kills_moves_and_upgrades() {
    let d = Dirs::new("sup");
    let mut args = vec!["--supervise", "--restart-limit", "1000", "--restart-window", "1"];
    args.extend(d.args(true));
    let log = d.d.root.join("supervisor.log");
    let sup = MountProcess::try_start_env(bin(), &d.d.branches(), &d.d.mnt, &args, &[], &log)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut files: Vec<(String, Vec<u8>)> = (0..2).map(|i| (format!("f{i}"), pattern(200_000, 70 + i))).collect();
    for (p, data) in &files {
        write_synced(&d.m(p), data);
    }
    let inos: Vec<u64> = files.iter().map(|(p, _)| fs::metadata(d.m(p)).unwrap().ino()).collect();
    let held = OpenOptions::new().read(true).write(true).open(d.m("f0")).unwrap();
    let write_held = |files: &mut [(String, Vec<u8>)], off: usize, seed: u64| {
        let data = pattern(3 * 4096, seed);
        held.write_all_at(&data, off as u64).unwrap();
        held.sync_data().unwrap();
        files[0].1[off..off + data.len()].copy_from_slice(&data);
    };
    assert!(n(&d.stats(), "tier", "dirty_blocks") > 0);

    // A crash: the supervisor's next daemon finds the tier's data (by id) and serves it.
    let first = daemon_of(&sup, None);
    // SAFETY: kill(2) of the daemon this test's supervisor started.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let second = daemon_of(&sup, Some(first));
    check(&d, &held, &files, &inos, "after a kill");
    assert!(sup.log_text().contains("of 2 files recovered and served from the tier"), "{}", sup.log_text());

    // Dirty again, moved with its descriptor held, written after the move.
    write_held(&mut files, 4096, 81);
    overwrite(&d.m("f1"), &mut files[1].1, 0, &pattern(100, 82));
    let s = d.balanced(&["--from", "0", "--to", "1", "--files", "2"]);
    assert_eq!(s["moved"].as_u64(), Some(2), "{s:#}");
    assert!(s["blocks_from_tier"].as_u64().unwrap() >= 4, "{s:#}");
    assert_eq!((d.on("f0"), d.on("f1")), ((false, true), (false, true)));
    write_held(&mut files, 10 * 4096, 83);
    check(&d, &held, &files, &inos, "after the move");

    // An upgrade in place (SIGHUP: the next daemon takes the mount and the tier over).
    sup.signal(libc::SIGHUP);
    let third = daemon_of(&sup, Some(second));
    check(&d, &held, &files, &inos, "after an upgrade");
    write_held(&mut files, 20 * 4096, 84);
    // And a crash with that write only in the tier.
    // SAFETY: as above.
    unsafe { libc::kill(third as i32, libc::SIGKILL) };
    daemon_of(&sup, Some(third));
    check(&d, &held, &files, &inos, "after a kill following the move");
    d.flush();
    for (p, data) in &files {
        assert_eq!(&d.on_disk(p), data, "{p}: written back elsewhere than its branch");
    }
    drop(held);
    sup.stop();
}

/// A SIGKILL at each step of a move of a file only in the tier, under `--supervise`: the
/// next daemon (on the live connection, the supervisor holding the inodes the kernel knows,
/// the moved file's source among them) finishes the move, finds the tier's data by id, and a
/// descriptor held across reads it and writes to the copy that is left.
#[test]
fn a_kill_at_each_step_of_a_move_under_supervise_with_dirty_tier_data_loses_nothing() {
    for step in ["before-copy", "mid-copy", "after-copy", "after-switch", "before-remove"] {
        let d = Dirs::new(&format!("supkill-{step}"));
        let fault = format!("balance:{step}");
        let mut args = vec!["--supervise", "--restart-limit", "1000", "--restart-window", "1"];
        args.extend(d.args(true));
        let log = d.d.root.join("supervisor.log");
        let sup =
            MountProcess::try_start_env(bin(), &d.d.branches(), &d.d.mnt, &args, &[("FARCACHE_FAULT", &fault)], &log)
                .unwrap_or_else(|e| panic!("{e}"));
        // Three chunks of copy: "mid-copy" is after the second.
        let mut files = vec![("f".to_string(), pattern((2 << 20) + 600_000, 71))];
        write_synced(&d.m("f"), &files[0].1);
        let inos = vec![fs::metadata(d.m("f")).unwrap().ino()];
        let held = OpenOptions::new().read(true).write(true).open(d.m("f")).unwrap();
        let daemon = daemon_of(&sup, None);
        let out = d.balance(&["--from", "0", "--to", "1", "--files", "1"]);
        assert!(!out.status.success(), "{step}: the daemon did not stop at the fault point");
        daemon_of(&sup, Some(daemon));
        assert!(sup.log_text().contains(&fault), "{step}: the fault point was not reached");
        let (a, b) = d.on("f");
        assert!(a != b, "{step}: the file is on {:?} (a, b): not exactly once", (a, b));
        assert_eq!(b, matches!(step, "after-switch" | "before-remove"), "{step}: on the target once switched");
        check(&d, &held, &files, &inos, step);
        assert!(!sup.log_text().contains("was deleted after"), "{step}: the tier took the file for deleted");
        let data = pattern(4096, 72);
        held.write_all_at(&data, 8192).unwrap();
        held.sync_data().unwrap();
        files[0].1[8192..8192 + 4096].copy_from_slice(&data);
        check(&d, &held, &files, &inos, step);
        d.flush();
        assert_eq!(d.on_disk("f"), files[0].1, "{step}: written back elsewhere than the file's branch");
        drop(held);
        sup.stop();
    }
}

#[test]
fn a_union_with_a_tier_is_taken_over_with_its_dirty_data() {
    let d = Dirs::new("takeover");
    let old = d.mount();
    let mut files: Vec<(String, Vec<u8>)> = (0..2).map(|i| (format!("f{i}"), pattern(150_000, 90 + i))).collect();
    for (p, data) in &files {
        write_synced(&d.m(p), data);
    }
    let inos: Vec<u64> = files.iter().map(|(p, _)| fs::metadata(d.m(p)).unwrap().ino()).collect();
    let held = OpenOptions::new().read(true).write(true).open(d.m("f0")).unwrap();
    // Moved with its data in the tier, then written: dirty in the tier at the handover.
    let s = d.balanced(&["--from", "0", "--to", "1", "--files", "1"]);
    assert_eq!(s["moved"].as_u64(), Some(1), "{s:#}");
    let moved = if d.on("f0").1 { 0 } else { 1 };
    overwrite(&d.m(&files[moved].0), &mut files[moved].1, 4096, &pattern(5000, 93));
    let log = d.d.root.join("new.log");
    let new = MountProcess::try_takeover(bin(), &d.d.branches(), &d.d.mnt, &d.args(true), &log)
        .unwrap_or_else(|e| panic!("{e}\nold daemon:\n{}", old.log_text()));
    old.release_mount();
    assert_eq!(old.wait_exit(), 0, "{}", old.log_text());
    check(&d, &held, &files, &inos, "after the takeover");
    assert!(new.log_text().contains("took the write-back tier over"), "{}", new.log_text());
    // Moves and write-back go on in the new daemon, each file to its branch.
    overwrite(&d.m("f0"), &mut files[0].1, 0, &pattern(300, 94));
    let from = if d.on("f0").0 { "0" } else { "1" };
    let to = if from == "0" { "1" } else { "0" };
    let s = d.balanced(&["--from", from, "--to", to, "--files", "1"]);
    assert_eq!(s["moved"].as_u64(), Some(1), "{s:#}");
    check(&d, &held, &files, &inos, "after a move by the new daemon");
    drop(held);
    new.stop();
    for (p, data) in &files {
        assert_eq!(&d.on_disk(p), data, "{p} after a clean unmount");
    }
}
