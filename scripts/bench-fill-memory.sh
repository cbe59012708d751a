#!/usr/bin/env bash
# The mount daemon's memory while every read fills the lenders behind a link slower than the
# disk (BENCHMARKS.md, sessions 59-60): one lender on loopback, a mount with
# `--routing threshold` (every small read fills), eight `farcache randread` of 128 MiB at once
# over a 1 GiB file, loopback behind a TBF of RATE. Every 2 s it samples the daemon's
# `Anonymous` (/proc/PID/smaps_rollup) and the fills in flight (`farcache stats`); after the
# readers it lifts the TBF, waits 5 s and samples once more ("drained").
#   ./scripts/bench-fill-memory.sh BIN RATE OUT     e.g. /tmp/farcache 1gbit /tmp/fm/b1
#   RATE: a tc rate (1gbit) or "none"; root for tc. The TBF is on `lo`, which every process
#   on the machine shares: run nothing else meanwhile. Results: OUT/samples, OUT/stats.txt,
#   OUT/passes (each reader's pass line).
set -euo pipefail
BIN=${1:?BIN}
RATE=${2:?RATE}
OUT=${3:?OUT}
[ "$RATE" = none ] || [ "$(id -u)" = 0 ] || { echo "bench-fill-memory: a TBF on lo needs root" >&2; exit 1; }
work=$(mktemp -d /tmp/fill-memory.XXXXXX)
mkdir -p "$OUT" "$work/back" "$work/mnt"
sp='' mp=''
cleanup() {
  [ "$RATE" = none ] || tc qdisc del dev lo root 2>/dev/null || true
  mountpoint -q "$work/mnt" && { fusermount3 -u "$work/mnt" 2>/dev/null || umount -l "$work/mnt"; }
  [ -n "$mp" ] && wait "$mp" 2>/dev/null || true
  [ -n "$sp" ] && { kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT
head -c 1G /dev/urandom >"$work/back/data.bin"
sync "$work/back/data.bin"
"$BIN" server --listen 127.0.0.1:0 --capacity 2GiB >"$OUT/server.log" 2>&1 &
sp=$!
addr=''
for _ in $(seq 100); do
  addr=$(grep -o '127.0.0.1:[0-9]*' "$OUT/server.log" | head -1 || true)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || { echo "bench-fill-memory: the lender did not start: $OUT/server.log" >&2; exit 1; }
"$BIN" mount "$work/back" "$work/mnt" --server "$addr" --routing threshold >"$OUT/mount.log" 2>&1 &
mp=$!
for _ in $(seq 100); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
mountpoint -q "$work/mnt" || { echo "bench-fill-memory: the mount did not come up: $OUT/mount.log" >&2; exit 1; }
[ "$RATE" = none ] || tc qdisc add dev lo root tbf rate "$RATE" burst 256kb latency 20ms
readers=()
for s in 1 2 3 4 5 6 7 8; do
  "$BIN" randread "$work/mnt/data.bin" --size 128MiB --passes 1 --seed "$s" >"$OUT/reader$s.log" 2>&1 &
  readers+=($!)
done
alive() {
  for p in "${readers[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
: >"$OUT/samples"
t=0
while alive && [ $t -le 600 ]; do
  anon=$(awk '/^Anonymous/{print $2}' "/proc/$mp/smaps_rollup")
  fills=$("$BIN" stats "$work/mnt" 2>/dev/null | grep -o '[0-9]* in flight[^,]*' || true)
  echo "t=$t anon_kB=$anon $fills" >>"$OUT/samples"
  t=$((t + 2))
  sleep 2
done
wait "${readers[@]}"
[ "$RATE" = none ] || tc qdisc del dev lo root
sleep 5
echo "drained anon_kB=$(awk '/^Anonymous/{print $2}' "/proc/$mp/smaps_rollup")" >>"$OUT/samples"
"$BIN" stats "$work/mnt" >"$OUT/stats.txt" 2>&1
grep -h "^pass" "$OUT"/reader*.log >"$OUT/passes"
