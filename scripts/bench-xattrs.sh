#!/usr/bin/env bash
# What the kernel's security.capability lookup before every write(2) costs a FUSE mount, and
# what `[mount] xattrs = false` gives back (docs/SEMANTICS.md, "Extended attributes"): two
# passthrough mounts (--no-remote) of one tmpfs backing, xattrs on (the default) and off, and
# the same file written natively on the tmpfs for reference. fio, 4 KiB random pwrite() of a
# 64 MiB file, one job, SECS seconds per point: plain writes and write + fdatasync pairs.
# ROUNDS rounds, configurations in rotating order; medians of the rounds' IOPS and p50s.
# Writes bench/results/xattrs.{md,tsv}. Root (tmpfs mount). Part of `make bench`.
set -euo pipefail
BIN=${BIN:-target/release/farcache}
ROUNDS=${ROUNDS:-5}
SECS=${SECS:-3}
OUT=${OUT:-bench/results}
SCRIPT=bench-xattrs
# shellcheck source=lib/bench-procs.sh
. "$(dirname "$0")/lib/bench-procs.sh"
[ -x "$BIN" ] || { echo "bench-xattrs: $BIN missing (cargo build --release -p farcache-cli)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench-xattrs: needs root (a tmpfs backing)" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench-xattrs: needs fio (apt-get install -y fio)" >&2; exit 1; }
mkdir -p "$work/backing" "$OUT"
mount -t tmpfs -o size=160M tmpfs "$work/backing"
head -c 64M /dev/zero >"$work/backing/f"
printf '[mount]\nxattrs = false\n' >"$work/off.toml"
start_mount() {
  local tag=$1; shift
  mkdir -p "$work/mnt-$tag"
  "$BIN" mount "$work/backing" "$work/mnt-$tag" --no-remote "$@" >"$work/mount-$tag.out" 2>"$work/mount-$tag.log" &
  pids+=($!)
  wait_for "$work/mount-$tag.out" "farcache mounted" "$!"
}
start_mount on
start_mount off --config "$work/off.toml"

# One fio point: IOPS and completion-latency p50 (µs) of writes, for `file` and `sync` (0/1).
point() {
  local file=$1 sync=$2
  fio --name=w --filename="$file" --rw=randwrite --bs=4k --size=64M --ioengine=psync --fdatasync="$sync" \
    --time_based --runtime="$SECS" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; print(round(j["iops"]), round(j["clat_ns"]["percentile"]["50.000000"]/1000))'
}
results="$work/results.tsv"
: >"$results"
MODES=(native on off)
for round in $(seq "$ROUNDS"); do
  for i in 0 1 2; do
    mode=${MODES[$(( (i + round) % 3 ))]}
    file="$work/mnt-$mode/f"
    [ "$mode" = native ] && file="$work/backing/f"
    for sync in 0 1; do
      read -r iops p50 < <(point "$file" "$sync")
      printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$sync" "$iops" "$p50" >>"$results"
    done
  done
  echo "bench-xattrs: round $round/$ROUNDS done"
done
cp "$results" "$OUT/xattrs.tsv"
python3 - "$results" "$ROUNDS" "$SECS" >"$OUT/xattrs.md" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
med = lambda mode, sync, col: statistics.median(int(r[col]) for r in rows if r[1] == mode and r[2] == sync)
print(f"4 KiB random pwrite() of a 64 MiB file on tmpfs, one job, {sys.argv[3]} s per point, "
      f"{sys.argv[2]} rounds in rotating order; medians. `on`/`off`: passthrough mounts "
      "(--no-remote) with `[mount] xattrs` true (default) / false.\n")
print("| writes | native IOPS | xattrs on IOPS | xattrs off IOPS | off ÷ on | native p50 | on p50 | off p50 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for sync, name in (("0", "pwrite"), ("1", "pwrite + fdatasync")):
    n, on, off = (med(m, sync, 3) for m in ("native", "on", "off"))
    pn, pon, poff = (med(m, sync, 4) for m in ("native", "on", "off"))
    print(f"| {name} | {n:,} | {on:,} | {off:,} | {off / on:.2f} | {pn} µs | {pon} µs | {poff} µs |")
EOF
cat "$OUT/xattrs.md"
