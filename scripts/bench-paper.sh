#!/usr/bin/env bash
# Paper 000's evaluation, the full set (`make bench`): removes leftovers of killed runs, runs
# seqread, randread, pgbench and tpch on the cloud disk profile (measured in session 5: seqread
# and randread 35 min, pgbench 15 min, tpch about 70 min for its four configurations, bounded by
# --tpch-deadline, 4 h), then draws the plots.
#   FARCACHE_PAPER_HDD=1  also the paper's own point: randread at 1 GiB on the hdd profile
#                         (200 IOPS; passthrough and farcache only; about 60 minutes more).
#   FARCACHE_PAPER_ARGS   extra arguments for every `farcache bench paper` run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
if [ "$(id -u)" != 0 ]; then
  echo "bench-paper: needs root (loop devices, cgroups, network namespaces); skipped" >&2
  exit 1
fi
./scripts/bench-deps.sh
"$BIN" bench paper --cleanup
# shellcheck disable=SC2086
"$BIN" bench paper --out "$OUT" ${FARCACHE_PAPER_ARGS:-}
python3 scripts/bench-paper-plot.py "$OUT/paper-cloud.json"
if [ "${FARCACHE_PAPER_HDD:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  "$BIN" bench paper --out "$OUT" --profile hdd --experiment randread --sizes 1GiB \
    --configs passthrough,farcache ${FARCACHE_PAPER_ARGS:-}
  python3 scripts/bench-paper-plot.py "$OUT/paper-hdd.json"
fi
