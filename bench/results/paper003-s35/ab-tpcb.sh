#!/usr/bin/env bash
# TPC-B through the ssd tier, A (this session's first build) against B (the flush outside the
# commit lock), interleaved; the passthrough beside each round for the ratio.
#   sudo A=/tmp/s35/farcache-aabd85d B=/tmp/s35/farcache-pipe bench/results/paper003-s35/ab-tpcb.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=bench/results/paper003-s35/ab-tpcb
for r in $(seq 1 "${ROUNDS:-1}"); do
  for v in A B; do
    dir="$OUT/$v-$r"
    mkdir -p "$dir"
    "${!v}" bench paper --cleanup >/dev/null
    "${!v}" bench paper --profile cloud --experiment pgbench --configs "${CONFIGS:-passthrough,tier-ssd}" \
      --pgbench-secs "${PGBENCH_SECS:-20}" --out "$dir" >"$dir/log" 2>&1
    echo "round $r $v done"
  done
done
