#!/usr/bin/env bash
# A lender hit through the mount against its physical parts (issue 17, item 5), side by side
# in one run: the FUSE round trip of a read whose data is in memory (a passthrough mount,
# --no-remote, of a tmpfs backing: no disk), a raw GET round trip to a lender on loopback
# (`farcache bench server`'s synchronous client, one connection, one key per request), and
# a lender hit through the mount — with the reading thread's own fetch connections (the
# default) and without them (cache.fetch_connections = 0: every fetch handed to the remote
# runtime and back), and with fetch connections that poll for the answer for 50 µs before
# sleeping (cache.fetch_poll = "50us"; off by default); and a read farcache keeps on the disk (a
# mount with its default routing, which keeps every read on the tmpfs, faster than a lender: what
# the engine adds to a read it does not serve, against the passthrough's FUSE round trip).
# ROUNDS rounds, modes in rotating order; medians of the p50s.
# Target: hit p50 <= 1.15 x (FUSE p50 + GET p50). Writes bench/results/hit-path.{md,json}.
# Root (tmpfs mount). Part of `make bench`.
set -euo pipefail
BIN=${BIN:-target/release/farcache}
ROUNDS=${ROUNDS:-7}
OUT=${OUT:-bench/results}
SCRIPT=bench-hit-path
# shellcheck source=lib/bench-procs.sh
. "$(dirname "$0")/lib/bench-procs.sh"
[ -x "$BIN" ] || { echo "bench-hit-path: $BIN missing (cargo build --release -p farcache-cli)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench-hit-path: needs root (a tmpfs backing)" >&2; exit 1; }
mkdir -p "$OUT"
tmpfs_file_and_lender
printf '[cache]\nfetch_connections = 0\n' >"$work/runtime.toml"
printf '[cache]\nfetch_poll = "50us"\n' >"$work/poll.toml"
start_mount() {
  local tag=$1; shift
  mkdir -p "$work/mnt-$tag"
  "$BIN" mount "$work/backing" "$work/mnt-$tag" "$@" >"$work/mount-$tag.out" 2>"$work/mount-$tag.log" &
  pids+=($!)
  wait_for "$work/mount-$tag.out" "farcache mounted" "$!"
}
start_mount fuse --no-remote
start_mount hit --server "$addr" --routing threshold
start_mount runtime --config "$work/runtime.toml" --server "$addr" --routing threshold
start_mount poll --config "$work/poll.toml" --server "$addr" --routing threshold
start_mount disk --server "$addr"
for tag in fuse hit runtime poll disk; do "$BIN" randread "$work/mnt-$tag/f" --passes 2 >/dev/null 2>&1; done

p50() { sed -E 's/.*p50 ([0-9]+) us.*/\1/' <<<"$1"; }
results="$work/results.tsv"
: >"$results"
MODES=(fuse get hit poll runtime disk)
for round in $(seq "$ROUNDS"); do
  for i in "${!MODES[@]}"; do
    mode=${MODES[$(( (i + round) % ${#MODES[@]} ))]}
    if [ "$mode" = get ]; then
      "$BIN" bench server --no-memcached --connections 1 --batches 1 --mixes get --duration 3s --warmup 1s \
        --keys 4096 --retries 0 --json "$work/get.json" >/dev/null 2>&1
      us=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["latency_us_p50"])' "$work/get.json")
    else
      line=$("$BIN" randread "$work/mnt-$mode/f" --passes 1 --verify "$work/backing/f" 2>&1 | grep '^pass 1:')
      us=$(p50 "$line")
    fi
    printf '%s\t%s\t%s\n' "$round" "$mode" "$us" >>"$results"
  done
  echo "bench-hit-path: round $round/$ROUNDS done"
done
hits() { "$BIN" stats "$work/mnt-$1" --json | python3 -c 'import json,sys; r=json.load(sys.stdin)["remote"]; print(r["hits"], r["misses"], r["fetch_connects"], r["fetches_polled"])'; }
routed() { "$BIN" stats "$work/mnt-disk" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["engine"]["adaptive_disk"], d["engine"]["adaptive_remote"])'; }
python3 - "$results" "$OUT" "$ROUNDS" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(hits hit)" "$(hits runtime)" "$(hits poll)" "$(routed)" <<'PY'
import json, statistics, sys
path, out, rounds, cpus, load, hit_stats, rt_stats, poll_stats, disk_stats = sys.argv[1:]
rows = [l.split("\t") for l in open(path).read().splitlines()]
med = {m: statistics.median(float(r[2]) for r in rows if r[1] == m) for m in ("fuse", "get", "hit", "poll", "runtime", "disk")}
limit = 1.15 * (med["fuse"] + med["get"])
# Each round's disk read over its FUSE round trip, adjacent in the round: the machine drifts
# between rounds more than the two differ.
by_round = {}
for r in rows:
    by_round.setdefault(r[0], {})[r[1]] = float(r[2])
disk_ratio = statistics.median(v["disk"] / v["fuse"] for v in by_round.values())
lines = [f"4 KiB O_DIRECT random reads of a 64 MiB file on tmpfs, {rounds} rounds in rotating order; {cpus} CPUs, "
         f"load average at the end {load}. Medians of each round's p50.", "",
         "| what | p50 |", "|---|---:|",
         f"| FUSE round trip, data in memory (passthrough of tmpfs) | {med['fuse']:.0f} µs |",
         f"| raw GET round trip to a lender (loopback, synchronous client) | {med['get']:.0f} µs |",
         f"| lender hit through the mount, fetch connections (default) | {med['hit']:.0f} µs |",
         f"| lender hit through the mount, fetch connections polling 50 µs (fetch_poll = 50us) | {med['poll']:.0f} µs |",
         f"| lender hit through the mount, via the remote runtime (fetch_connections = 0) | {med['runtime']:.0f} µs |",
         f"| a read farcache keeps on the disk (default routing, tmpfs faster than a lender) | {med['disk']:.0f} µs |",
         "",
         f"Target: hit ≤ 1.15 × (FUSE + GET) = {limit:.0f} µs: {med['hit']:.0f} µs — "
         f"{'met' if med['hit'] <= limit else 'NOT met'} ({med['hit'] / (med['fuse'] + med['get']):.2f}× the sum; "
         f"polling {med['poll'] / (med['fuse'] + med['get']):.2f}×; "
         f"without fetch connections {med['runtime'] / (med['fuse'] + med['get']):.2f}×). "
         f"Mount counters (hits, misses, fetch connections made, fetches answered while polling): "
         f"default {hit_stats}, polling {poll_stats}, runtime {rt_stats}. "
         f"A read kept on the disk: {disk_ratio:.2f}× the passthrough's FUSE round trip (median of the rounds' "
         f"ratios; that mount's reads sent to the disk, to the lenders: {disk_stats})."]
text = "\n".join(lines) + "\n"
print(text)
open(f"{out}/hit-path.md", "w").write(text)
json.dump({"rounds": int(rounds), "cpus": int(cpus), "load": load, "p50_us": med, "target_us": limit,
           "disk_over_fuse": disk_ratio,
           "rows": rows}, open(f"{out}/hit-path.json", "w"), indent=1)
PY
