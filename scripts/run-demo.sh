#!/usr/bin/env bash
# `make run`: farcache's main job, measured in about two minutes. Random 4 KiB reads of a file
# that lives on a slow disk, through a plain passthrough (`farcache mount --no-remote`) and
# through farcache (`farcache mount` with no --server: a lender with the [server] defaults runs
# inside the mount's own process, default settings otherwise), side by side:
#
#   1. an emulated slow disk, the way `farcache bench paper` makes one (crates/bench/src/paper/
#      testbed.rs): a sparse file attached to a loop device with `losetup --direct-io=on` (the
#      loop driver reads its file with O_DIRECT, so the page cache is not a second cache),
#      formatted ext4 and mounted noatime, and a blkio v1 cgroup that caps the loop device at
#      DEMO_IOPS read and write IOPS and DEMO_BPS bytes/s (the "cloud" profile: 3000 IOPS,
#      125 MB/s). The cap applies to the processes in the cgroup: each mount daemon starts inside
#      it, and it reads its backing files with O_DIRECT, so every read it makes is throttled;
#   2. the backing directory on it, with one file of DEMO_SIZE MiB of random bytes (written by
#      this script, outside the cgroup: not throttled);
#   3. for each configuration, from a cold start — page cache dropped (`echo 3 >
#      /proc/sys/vm/drop_caches`), a fresh mount, so a fresh embedded lender — the same
#      `farcache randread MNT/data.bin --size DEMO_READ --passes 2 --verify BACKING/data.bin`:
#      4 KiB O_DIRECT reads (every one reaches the mount, as on a host whose page cache is too
#      small) at random offsets, the same offsets in both passes, every block compared with the
#      backing file (verification is not timed); `farcache stats MNT` of the farcache mount;
#   4. a table: each configuration's 1st and 2nd pass, and farcache ÷ passthrough per pass.
#
# Without root, losetup, mkfs.ext4 or the blkio v1 hierarchy at /sys/fs/cgroup/blkio it says
# which is missing and runs the same comparison on the plain disk, which is faster than the
# embedded lender's round trip: there farcache is not expected to win (BENCHMARKS.md).
#
# Everything it makes is undone on every exit path (success, failure, Ctrl-C, SIGTERM): the
# mounts, the daemons, the loop device, the cgroup, the files. Every wait has a bound.
#
# Environment overrides (all optional):
#   BIN             the farcache binary                      (default target/release/farcache)
#   DEMO_SIZE       MiB of random bytes in the file           (default 512)
#   DEMO_READ       bytes read per pass, 4 KiB at a time      (default 384MiB: 98,304 reads)
#   DEMO_IOPS       the slow disk's read and write IOPS cap   (default 3000)
#   DEMO_BPS        the slow disk's bytes/s cap               (default 125000000)
#   DEMO_DIR        where the work directory goes; not tmpfs  (default ./target)
#   DEMO_SLOW_DISK  auto: the slow disk when possible; 0: the plain disk   (default auto)
set -euo pipefail

BIN=${BIN:-target/release/farcache}
SIZE=${DEMO_SIZE:-512}
READ=${DEMO_READ:-384MiB}
IOPS=${DEMO_IOPS:-3000}
BPS=${DEMO_BPS:-125000000}
SLOW=${DEMO_SLOW_DISK:-auto}
CGROOT=/sys/fs/cgroup/blkio

for v in SIZE IOPS BPS; do
  case ${!v} in '' | *[!0-9]*) echo "run-demo: DEMO_$v=${!v}: want a whole number" >&2; exit 2 ;; esac
done
[ "$SIZE" -ge 1 ] || { echo "run-demo: DEMO_SIZE must be at least 1 (MiB)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "run-demo: $BIN is not an executable (build it: make build)" >&2; exit 2; }

mkdir -p "${DEMO_DIR:-$PWD/target}"
work=$(mktemp -d "${DEMO_DIR:-$PWD/target}/demo.XXXXXX")
mnt=$work/mnt
cgroup=                  # the blkio cgroup's directory, once made
loopdev=                 # /dev/loopN, once attached
disk=                    # where the loop device's ext4 is mounted, once mounted
mount_pid=               # the running `farcache mount`
reader_pid=              # the running `farcache randread`
made_disk=               # non-empty once a loop device was asked for
made_cgroup=             # non-empty once the cgroup was asked for
t_start=$(date +%s)

log() { printf '%s\n' "$*"; }
# Is $1 a mount point now? (field 5 of /proc/self/mountinfo; our paths have no spaces to escape)
is_mounted() { awk -v m="$1" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo; }
# Wait up to $2 tenths of a second for process $1 to end; true if it did.
wait_gone() {
  local i
  for ((i = 0; i < $2; i++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  ! kill -0 "$1" 2>/dev/null
}
# Stop process $1 (ours): SIGTERM, up to $2 tenths of a second, then SIGKILL; reap it.
stop_pid() {
  [ -n "$1" ] || return 0
  if kill -0 "$1" 2>/dev/null; then
    kill -TERM "$1" 2>/dev/null || true
    wait_gone "$1" "$2" || { kill -KILL "$1" 2>/dev/null || true; wait_gone "$1" 50 || true; }
  fi
  wait "$1" 2>/dev/null || true
}

stop_mount() {
  stop_pid "$mount_pid" 300 # the daemon unmounts on SIGTERM
  mount_pid=
  if is_mounted "$mnt"; then fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; fi
}

remove_cgroup() {
  if [ -z "$cgroup" ] || [ ! -d "$cgroup" ]; then
    cgroup=
    return 0
  fi
  local i p
  for ((i = 0; i < 50; i++)); do
    # Only our own daemons were ever put in it; whatever is left is ours to end.
    while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$cgroup/cgroup.procs"
    rmdir "$cgroup" 2>/dev/null && break
    sleep 0.1
  done
  [ -d "$cgroup" ] && echo "run-demo: warning: could not remove the cgroup $cgroup" >&2
  cgroup=
}

teardown_disk() {
  local i
  if [ -n "$disk" ] && is_mounted "$disk"; then
    for ((i = 0; i < 20; i++)); do
      timeout 30 umount "$disk" 2>/dev/null && break
      sleep 0.25
    done
    is_mounted "$disk" && { timeout 30 umount -l "$disk" 2>/dev/null || echo "run-demo: warning: could not unmount $disk" >&2; }
  fi
  disk=
  # Every loop device on our image (found by its file, not by $loopdev: also one attached just
  # before an interrupt could name it). After a lazy unmount a device is still busy: -d then
  # detaches it once it is free.
  local dev
  if [ -f "$work/disk.img" ]; then
    for dev in $(timeout 30 losetup -n -O NAME -j "$work/disk.img" 2>/dev/null); do
      timeout 30 losetup -d "$dev" 2>/dev/null || echo "run-demo: warning: could not detach $dev" >&2
    done
  fi
  loopdev=
}

cleanup() {
  local code=$?
  # A second Ctrl-C must not cut the teardown short; every step below is bounded.
  trap '' INT TERM HUP
  stop_pid "$reader_pid" 50
  reader_pid=
  stop_mount
  remove_cgroup
  teardown_disk
  rm -rf "$work"
  local what="mounts, daemons${made_disk:+, the loop device and its ext4}${made_cgroup:+, the blkio cgroup}, $work"
  if [ "$code" -eq 0 ]; then
    log "done in $(($(date +%s) - t_start)) s; removed: $what"
  else
    echo "run-demo: stopped (exit $code); cleaned up: $what" >&2
  fi
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ---- 1. the slow disk, when this machine can make one -------------------------------------

why_not=  # why there is no slow disk, in words
slow_disk_missing() {
  [ "$SLOW" = 0 ] && { why_not="DEMO_SLOW_DISK=0 asked for the plain disk"; return 0; }
  [ "$(id -u)" = 0 ] || { why_not="not root (uid $(id -u)): a loop device, an ext4 mount and a blkio cgroup need root"; return 0; }
  command -v losetup >/dev/null || { why_not="no losetup command (Debian package util-linux)"; return 0; }
  command -v mkfs.ext4 >/dev/null || { why_not="no mkfs.ext4 command (Debian package e2fsprogs)"; return 0; }
  [ -f "$CGROOT/cgroup.procs" ] || { why_not="no cgroup v1 blkio hierarchy at $CGROOT (a cgroup v2-only system?)"; return 0; }
  [ -f "$CGROOT/blkio.throttle.read_iops_device" ] || { why_not="$CGROOT has no blkio.throttle.* files (kernel built without blkio throttling)"; return 0; }
  [ -w /proc/sys/vm/drop_caches ] || { why_not="/proc/sys/vm/drop_caches is not writable: cold starts are impossible"; return 0; }
  return 1
}

# Make the disk; on failure set why_not and return 1 (the caller tears down what was made).
setup_slow_disk() {
  local img=$work/disk.img out name dio f
  # The file, a quarter more for ext4's own blocks, and 64 MiB of slack. Sparse: nothing is
  # written until mkfs and the file are.
  truncate -s "$((SIZE * 5 / 4 + 64))M" "$img" || { why_not="cannot create $img"; return 1; }
  made_disk=1
  out=$(timeout 60 losetup --direct-io=on --show -f "$img" 2>&1) || { why_not="losetup --direct-io=on -f failed: $out"; return 1; }
  loopdev=$out
  name=${loopdev#/dev/}
  dio=$(cat "/sys/block/$name/loop/dio" 2>/dev/null || true)
  [ "$dio" = 1 ] || { why_not="$loopdev did not switch to direct I/O (loop/dio=${dio:-?}): its reads would hit the page cache"; return 1; }
  devno=$(cat "/sys/block/$name/dev") || { why_not="cannot read the device number of $loopdev"; return 1; }
  out=$(timeout 120 mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loopdev" 2>&1) || { why_not="mkfs.ext4 $loopdev failed: $out"; return 1; }
  mkdir -p "$work/disk"
  disk=$work/disk # set first: an interrupt right after the mount must still find it
  out=$(timeout 60 mount -t ext4 -o noatime "$loopdev" "$disk" 2>&1) || { why_not="mounting $loopdev failed: $out"; return 1; }
  cgroup=$CGROOT/farcache-demo-$$
  made_cgroup=1
  out=$(mkdir "$cgroup" 2>&1) || { why_not="cannot create a blkio cgroup: $out"; return 1; }
  for f in read_iops_device write_iops_device; do
    echo "$devno $IOPS" >"$cgroup/blkio.throttle.$f" 2>/dev/null || { why_not="cannot set blkio.throttle.$f"; return 1; }
  done
  for f in read_bps_device write_bps_device; do
    echo "$devno $BPS" >"$cgroup/blkio.throttle.$f" 2>/dev/null || { why_not="cannot set blkio.throttle.$f"; return 1; }
  done
  return 0
}

if slow_disk_missing; then
  :
elif ! setup_slow_disk; then
  remove_cgroup
  teardown_disk
fi

if [ -z "$why_not" ]; then
  backing=$disk/backing
  where="an emulated slow disk: $loopdev (loop, direct I/O) with ext4, capped by blkio at $IOPS IOPS and $((BPS / 1000000)) MB/s for the mount daemon"
  log "== the slow disk: $loopdev ($devno), ext4 on $work/disk; blkio cgroup $cgroup: $IOPS IOPS, $((BPS / 1000000)) MB/s"
else
  backing=$work/backing
  where="the plain disk (no emulated slow disk: $why_not)"
  log "== no emulated slow disk: $why_not"
  log "   Running on the plain disk instead. This disk is faster than the embedded lender's round trip,"
  log "   so farcache is not expected to win here; see BENCHMARKS.md."
fi
mkdir -p "$backing" "$mnt"

# ---- 2. the file ----------------------------------------------------------------------------

log "== $backing/data.bin: $SIZE MiB of random bytes"
# O_DIRECT: none of it stays in the page cache. This process is in no cgroup of ours: not throttled.
head -c "${SIZE}M" /dev/urandom | dd of="$backing/data.bin" bs=1M iflag=fullblock oflag=direct status=none &
reader_pid=$!
wait "$reader_pid"
reader_pid=
sync
# Read it once, also with O_DIRECT and unthrottled, so that whatever the machine under this VM
# caches of it is the same for both configurations (the file was just written: some of it may be).
dd if="$backing/data.bin" of=/dev/null bs=1M iflag=direct status=none &
reader_pid=$!
wait "$reader_pid"
reader_pid=

# ---- 3. the two configurations ----------------------------------------------------------------

# Start `farcache mount BACKING MNT ARGS...` in the background (inside the blkio cgroup when
# there is one: the cgroup is joined before exec, so every thread of the daemon is in it); wait
# up to 20 s for its "mounted" line.
start_mount() {
  local i
  (
    if [ -n "$cgroup" ]; then echo "$BASHPID" >"$cgroup/cgroup.procs"; fi
    exec "$BIN" mount "$backing" "$mnt" "$@"
  ) >"$work/mount.out" 2>"$work/mount.log" &
  mount_pid=$!
  for ((i = 0; i < 200; i++)); do
    grep -q "farcache mounted" "$work/mount.out" 2>/dev/null && break
    kill -0 "$mount_pid" 2>/dev/null || { echo "run-demo: farcache mount exited early:" >&2; cat "$work/mount.log" >&2; exit 1; }
    sleep 0.1
  done
  grep -q "farcache mounted" "$work/mount.out" || { echo "run-demo: farcache mount did not come up in 20 s:" >&2; cat "$work/mount.log" >&2; exit 1; }
  if [ -n "$cgroup" ] && ! grep -qx "$mount_pid" "$cgroup/cgroup.procs"; then
    echo "run-demo: the mount daemon ($mount_pid) is not in $cgroup: its reads would not be throttled" >&2
    exit 1
  fi
}

# Reads the slow disk has served to the cgroup (the mount daemons) so far. (blkio.reset_stats
# does not reset the throttle's counters on this kernel: callers take differences.)
disk_reads() {
  [ -n "$cgroup" ] || { echo "-"; return; }
  awk -v d="$devno" '$1 == d && $2 == "Read" { n = $3 } END { print n + 0 }' "$cgroup/blkio.throttle.io_serviced"
}

# One configuration: name, then the mount's arguments. Leaves NAME.json (randread's result),
# NAME.disk (disk reads) and, for farcache, stats.txt in $work.
run_config() {
  local name=$1
  shift
  log
  log "== $name: cold start (sync; echo 3 > /proc/sys/vm/drop_caches; a fresh mount)"
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; else log "   (not root: the page cache cannot be dropped)"; fi
  log "   $BIN mount $backing $mnt $*"
  start_mount "$@"
  local before
  before=$(disk_reads)
  log "   $BIN randread $mnt/data.bin --size $READ --passes 2 --verify $backing/data.bin"
  "$BIN" randread "$mnt/data.bin" --size "$READ" --passes 2 --verify "$backing/data.bin" --json \
    >"$work/$name.json" &
  reader_pid=$!
  if ! wait "$reader_pid"; then
    # A Ctrl-C reaches the daemon too (the reader, a background job, ignores it): the daemon
    # unmounts under the reader, which fails, sometimes before this shell's trap has run.
    # That is the interrupt, not a failure of the mount.
    if grep -q "SIGINT: unmounting" "$work/mount.log" 2>/dev/null; then exit 130; fi
    echo "run-demo: randread through the $name mount failed" >&2
    tail -n 20 "$work/mount.log" >&2
    exit 1
  fi
  reader_pid=
  if [ -n "$cgroup" ]; then echo "$(($(disk_reads) - before))" >"$work/$name.disk"; else echo - >"$work/$name.disk"; fi
  if [ "$name" = farcache ]; then timeout 10 "$BIN" stats "$mnt" >"$work/stats.txt" 2>&1 || true; fi
  stop_mount
}

# The order: passthrough first, then farcache, each from a cold start. Nothing of one run can
# reach the other: the page cache is dropped, the mount (and with it the embedded lender) is new,
# and the disk's speed is set by the throttle, not by what the machine under this VM caches of
# the disk image — which the unthrottled read above made the same for both. So the order cannot
# favour either; the baseline goes first so that its numbers are on screen before farcache's.
run_config passthrough --no-remote
run_config farcache

# ---- 4. the table ---------------------------------------------------------------------------

reads=$(sed -n 's/.*"reads_per_pass":\([0-9]*\).*/\1/p' "$work/passthrough.json")
log
log "== results: $reads reads of 4 KiB per pass (O_DIRECT, random offsets, the same in both passes)"
log "   in a $SIZE MiB file on $where"
log
# randread --json: one line, {..., "passes":[{"pass":1,"secs":..,"reads_per_sec":..,"p50_us":..,...},...]}.
# Row r (1 passthrough, 2 farcache), pass p: v[r, p, key].
awk -v ptd="$(cat "$work/passthrough.disk")" -v fcd="$(cat "$work/farcache.disk")" '
  function num(text, key) {
    if (!match(text, "\"" key "\":[-0-9.eE+]+")) { bad = bad " " key; return 0 }
    return substr(text, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0
  }
  {
    r = FNR == NR ? 1 : 2
    n = split($0, parts, /\{"pass":/)
    for (i = 2; i <= n; i++) {
      split(parts[i], f, /[,}]/)
      p = f[1] + 0
      seen[r, p] = 1
      v[r, p, "secs"] = num(parts[i], "secs")
      v[r, p, "rate"] = num(parts[i], "reads_per_sec")
      v[r, p, "p50"] = num(parts[i], "p50_us")
      v[r, p, "p99"] = num(parts[i], "p99_us")
    }
  }
  END {
    for (r = 1; r <= 2; r++) for (p = 1; p <= 2; p++) if (!seen[r, p] || v[r, p, "rate"] <= 0) bad = bad " row" r "pass" p
    if (bad != "") { print "run-demo: randread results incomplete:" bad > "/dev/stderr"; exit 1 }
    dashes = "----------------------------------------"
    line = "  " substr(dashes, 1, 24) "+" dashes "+" dashes
    printf "  %-23s | %-38s | %s\n", "", "pass 1 (cold)", "pass 2 (the same offsets again)"
    hdr = sprintf("%8s %8s %9s %10s", "time", "reads/s", "p50", "p99")
    printf "  %-23s | %s | %s\n", "configuration", hdr, hdr
    print line
    name[1] = "passthrough"; name[2] = "farcache"
    for (r = 1; r <= 2; r++) {
      for (p = 1; p <= 2; p++) {
        cell[p] = sprintf("%7.2fs %8.0f %6d us %7d us", v[r, p, "secs"], v[r, p, "rate"], v[r, p, "p50"], v[r, p, "p99"])
      }
      printf "  %-23s | %s | %s\n", name[r], cell[1], cell[2]
    }
    print line
    # "÷" is two bytes and awk pads bytes: one column more.
    printf "  %-24s | %7.2fx %29s | %7.2fx\n", "farcache ÷ passthrough", \
      v[2, 1, "rate"] / v[1, 1, "rate"], "", v[2, 2, "rate"] / v[1, 2, "rate"]
    print ""
    print "  farcache ÷ passthrough: farcache reads/s ÷ passthrough reads/s (> 1: farcache faster)."
    if (ptd != "-") {
      printf "  Reads the slow disk served to the mount daemon, both passes: passthrough %d, farcache %d.\n", ptd, fcd
      print "  The throttle caps a rate, not a latency: most disk reads take ~0.1 ms and about one in a hundred"
      print "  waits tens of ms for the throttle'"'"'s next time slice, so p50 (even p99) understates the disk'"'"'s"
      print "  cost: compare reads/s."
    }
  }' "$work/passthrough.json" "$work/farcache.json"
log
log "== $BIN stats $mnt   (the farcache mount, after its two passes)"
sed 's/^/   /' "$work/stats.txt"
if [ -n "$why_not" ]; then
  log
  log "Note: this ran on the plain disk ($why_not)."
  log "This disk is faster than the embedded lender's round trip, so farcache is not expected to win here; see BENCHMARKS.md."
fi
log
