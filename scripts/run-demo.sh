#!/usr/bin/env bash
# `make run`: the main job on embedded defaults, end to end, in about a minute.
#   1. a backing directory with one 256 MiB file of random bytes;
#   2. `farcache mount` of it with no --server: a lender (512 MiB, the [server] defaults) runs
#      inside the mount's own process;
#   3. a two-pass random read through the mount (4 KiB, O_DIRECT so every read reaches the
#      mount, as on a host whose page cache is too small), every block verified against the
#      backing file; the second pass is served from the lender's RAM;
#   4. the mount's counters (`farcache stats MOUNTPOINT`);
#   5. the same read through a plain passthrough (`--no-remote`), the baseline.
# Cleans up after itself, also when interrupted: unmounts, stops the daemons, removes files.
set -euo pipefail
BIN=${BIN:-target/release/farcache}
SIZE=${DEMO_SIZE:-256}     # MiB in the file
READ=${DEMO_READ:-64MiB}   # read per pass
work=$(mktemp -d "${DEMO_DIR:-$PWD/target}/demo.XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  if grep -qs " $work/mnt " /proc/self/mountinfo; then fusermount3 -u -z "$work/mnt" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work/backing" "$work/mnt"
echo "== a backing directory with one file: $work/backing/data.bin ($SIZE MiB of random bytes)"
head -c "${SIZE}M" /dev/urandom >"$work/backing/data.bin"

# Start `farcache mount ARGS...` in the background; wait for its "mounted" line.
start_mount() {
  "$BIN" mount "$work/backing" "$work/mnt" "$@" >"$work/mount.out" 2>"$work/mount.log" &
  pid=$!
  for _ in $(seq 200); do
    grep -q "farcache mounted" "$work/mount.out" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { echo "farcache mount exited early:" >&2; cat "$work/mount.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "farcache mount did not come up in 20 s:" >&2; cat "$work/mount.log" >&2; exit 1
}
stop_mount() {
  kill -TERM "$pid"; wait "$pid"; pid=
}

echo; echo "== $BIN mount $work/backing $work/mnt   (no --server: an embedded lender)"
start_mount
echo; echo "== $BIN randread $work/mnt/data.bin --size $READ --passes 2 --verify $work/backing/data.bin"
"$BIN" randread "$work/mnt/data.bin" --size "$READ" --passes 2 --verify "$work/backing/data.bin"
echo; echo "== $BIN stats $work/mnt"
"$BIN" stats "$work/mnt"
stop_mount

echo; echo "== the baseline: $BIN mount --no-remote (a plain passthrough), the same reads"
start_mount --no-remote
"$BIN" randread "$work/mnt/data.bin" --size "$READ" --passes 2 --verify "$work/backing/data.bin"
stop_mount
echo; echo "done: unmounted, daemons stopped, $work removed"
