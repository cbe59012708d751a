#!/usr/bin/env bash
# The group commit with the flush outside the commit lock (B) against this session's first
# build (A): cpu.py's durable writers through each tier, the two builds interleaved, ROUNDS rounds.
#   sudo A=/tmp/s35/farcache-aabd85d B=/tmp/s35/farcache-pipe bench/results/paper003-s35/ab.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=bench/results/paper003-s35/ab
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in A B; do
    BIN=${!v} SECS=${SECS:-8} ROUNDS=1 PERF=0 CONFIGS="tier-ssd tier-dram" \
      python3 bench/results/paper003-s35/cpu.py "$OUT/$v-$r" >/dev/null
    echo "round $r $v done"
  done
done
