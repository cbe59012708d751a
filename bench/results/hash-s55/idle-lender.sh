#!/usr/bin/env bash
# Raw pgbench at one client, in rounds: the passthrough and farcache (defaults) in one
# `bench paper` invocation, and farcache with its lender connected but idle in another
# (--routing threshold with `[cache] threshold = "4KiB"`: every read is at least the threshold,
# so every read goes to the disk and nothing is filled, fetched or probed). Whether the
# machine runs PostgreSQL slower beside a lender and farcache's remote threads, or the
# default routing's work is what costs. Odd rounds run the default pair first (passthrough
# then farcache), even rounds the idle one first (then farcache, passthrough).
# Resumable per round and run. Table: python3 pgbench-per-read.py OUT 1.
#   BIN (required), OUT (default bench/results/hash-s55/idle-lender), ROUNDS (default 4)
set -euo pipefail
: "${BIN:?BIN=path of the farcache binary}"
OUT=${OUT:-bench/results/hash-s55/idle-lender}
ROUNDS=${ROUNDS:-4}
[ "$(id -u)" = 0 ] || { echo "idle-lender: needs root (bench paper)" >&2; exit 1; }
mkdir -p "$OUT"
idle_cfg=$(realpath "$OUT")/idle.toml
printf '[cache]\nthreshold = "4KiB"\n' >"$idle_cfg"
run() { # NAME ARGS...
  local dir=$1; shift
  if grep -qs '"complete": true' "$dir"/paper-raw.json; then echo "== $dir: done before"; return 0; fi
  mkdir -p "$dir"
  echo "== $dir ($(date -u +%T))"
  "$BIN" bench paper --profile raw --experiment pgbench --pgbench-clients 1 --out "$dir" "$@" >"$dir/log" 2>&1 ||
    echo "   failed or targets not met: see $dir/log"
}
"$BIN" bench paper --cleanup
for r in $(seq 1 "$ROUNDS"); do
  if ((r % 2)); then
    run "$OUT/r$r/default" --configs passthrough,farcache
    run "$OUT/r$r/idle" --configs farcache --routing threshold --mount-config "$idle_cfg"
  else
    run "$OUT/r$r/idle" --configs farcache --routing threshold --mount-config "$idle_cfg"
    run "$OUT/r$r/default" --configs farcache,passthrough
  fi
done
