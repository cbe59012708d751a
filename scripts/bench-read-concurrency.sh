#!/usr/bin/env bash
# What the mount daemon's CPU costs a read when several readers read at once, farcache against
# the passthrough: 4 KiB O_DIRECT random reads by JOBS fio jobs at once (psync, one read in
# flight each) of a file on an ext4 loop device over a file in /var/tmp (the raw profile's
# disk: far faster than a lender, so farcache's default routing keeps every read on it),
# through a passthrough mount (--no-remote) and a farcache mount with a lender on loopback,
# ROUNDS rounds of SECS seconds each, the two alternating. Per round: the reads served
# (`fuse.ops.read`), the daemon's CPU time (`cpu.user_us + system_us` of `farcache stats`),
# its context switches (/proc/PID/status), and so CPU µs and switches per read, and reads/s.
# Then, with PERF=1, one more round of each under `perf record -g` into $OUT (for `perf
# report`; not committed). callgrind (scripts/bench-read-cost.sh) counts one thread's
# instructions; this measures what several threads at once cost, locks and wake-ups included
# (session 68: the raw TPC-H throughput test, two query streams at once with every read on the
# disk, cost farcache's daemon 14% more CPU per read than the passthrough's, the power test,
# one stream, 0-2%). Root (a loop device); fio (scripts/deps.sh installs it). Part of `make
# bench`, about 2 min. Writes $OUT/read-concurrency.md.
#   BIN     the farcache binary (default target/release/farcache)
#   JOBS    readers at once (default 4)     SECS  seconds a round (default 10)
#   ROUNDS  rounds of each mount (default 3) PERF  1: a perf round of each (default 0)
set -euo pipefail
BIN=${BIN:-target/release/farcache}
JOBS=${JOBS:-4}
SECS=${SECS:-10}
ROUNDS=${ROUNDS:-3}
PERF=${PERF:-0}
OUT=${OUT:-bench/results}
SCRIPT=bench-read-concurrency
[ -x "$BIN" ] || { echo "$SCRIPT: $BIN missing (cargo build --release -p farcache-cli)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "$SCRIPT: needs root (a loop device)" >&2; exit 1; }
command -v fio >/dev/null || { echo "$SCRIPT: fio missing (apt-get install -y fio)" >&2; exit 1; }
BIN=$(realpath "$BIN")
# shellcheck source=lib/bench-procs.sh
. "$(dirname "$0")/lib/bench-procs.sh"
mkdir -p "$OUT"
loop=""
trap 'cleanup; [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null || true' EXIT

# The disk: ext4 on a loop device over a 512 MiB file in /var/tmp, one 256 MiB file on it.
img=$(mktemp /var/tmp/farcache-$SCRIPT.XXXXXX.img)
truncate -s 512M "$img"
mkfs.ext4 -q -F "$img"
loop=$(losetup --find --show "$img")
rm -f "$img" # the loop device holds it
mkdir -p "$work/backing"
mount "$loop" "$work/backing"
head -c 256M /dev/urandom >"$work/backing/f"
sync
printf '[server]\nlisten = "127.0.0.1:0"\ncapacity = "512MiB"\n' >"$work/server.toml"
"$BIN" server --config "$work/server.toml" >"$work/server.out" 2>"$work/server.log" &
pids+=($!)
wait_for "$work/server.out" "listening on" "$!"
addr=$(sed -n 's/.*listening on //p' "$work/server.out")

declare -A pid
start_mount() {
  local tag=$1
  shift
  mkdir -p "$work/mnt-$tag"
  "$BIN" mount "$work/backing" "$work/mnt-$tag" "$@" >"$work/mount-$tag.out" 2>"$work/mount-$tag.log" &
  pid[$tag]=$!
  pids+=("$!")
  wait_for "$work/mount-$tag.out" "farcache mounted" "$!" 300
}
start_mount pass --no-remote
start_mount farcache --server "$addr"

# The context switches of every thread of process $1 so far (voluntary and not).
switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {print s + 0}'
}

# A round: JOBS readers for SECS seconds; prints "reads cpu_us switches disk_share".
round() {
  local tag=$1 before after
  before=$("$BIN" stats "$work/mnt-$tag" --json)
  local sw0 sw1
  sw0=$(switches "${pid[$tag]}")
  timeout $((SECS + 30)) fio --name=r --filename="$work/mnt-$tag/f" --rw=randread --bs=4k --direct=1 \
    --ioengine=psync --numjobs="$JOBS" --runtime="$SECS" --time_based --group_reporting \
    --output="$work/fio-$tag.txt" >/dev/null
  after=$("$BIN" stats "$work/mnt-$tag" --json)
  sw1=$(switches "${pid[$tag]}")
  python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
reads = b["fuse"]["ops"]["read"] - a["fuse"]["ops"]["read"]
cpu = sum(b["cpu"][k] - a["cpu"][k] for k in ("user_us", "system_us"))
share = ((b.get("routing") or {}).get("adaptive") or {}).get("disk_share", "-")
print(reads, cpu, int(sys.argv[3]) - int(sys.argv[4]), share)
' "$before" "$after" "$sw1" "$sw0"
}

# Warm-up: each mount reads for SECS (farcache's rule settles on the disk).
round pass >/dev/null
round farcache >/dev/null
{
  echo "# Reads by $JOBS readers at once: daemon CPU per read, farcache against the passthrough"
  echo
  echo "\`BIN=$BIN JOBS=$JOBS SECS=$SECS ROUNDS=$ROUNDS scripts/$SCRIPT.sh\` ($(date -u +%FT%TZ), $("$BIN" --version 2>/dev/null || echo farcache))"
  echo
  echo "| round | mount | reads/s | daemon CPU µs a read | context switches a read | disk share |"
  echo "|---|---|---:|---:|---:|---:|"
} >"$work/table.md"
for r in $(seq "$ROUNDS"); do
  order="pass farcache"
  [ $((r % 2)) -eq 0 ] && order="farcache pass"
  for tag in $order; do
    read -r reads cpu sw share < <(round "$tag")
    python3 -c '
import sys
r, tag, reads, cpu, sw, share, secs = sys.argv[1:]
reads = max(int(reads), 1)
print(f"| {r} | {tag} | {int(reads) / float(secs):,.0f} | {int(cpu) / reads:.1f} | {int(sw) / reads:.2f} | {share} |")
' "$r" "$tag" "$reads" "$cpu" "$sw" "$share" "$SECS" >>"$work/table.md"
  done
done
if [ "$PERF" = 1 ]; then
  for tag in pass farcache; do
    perf record -g -o "$OUT/read-concurrency-$tag.perf" -p "${pid[$tag]}" -- sleep "$SECS" 2>/dev/null &
    perfpid=$!
    round "$tag" >/dev/null
    wait "$perfpid" || true
  done
fi
cp "$work/table.md" "$OUT/read-concurrency.md"
cat "$OUT/read-concurrency.md"
