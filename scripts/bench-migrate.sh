#!/usr/bin/env bash
# Paper 001 (issue 14) reproduced: two loop-device "HDDs" (the hdd profile: 200 IOPS, 150 MB/s
# each), N files of 4 MiB on the first, random whole-file reads by 1, 2 and 3 threads, and half
# the files moved to the second disk during the run by `farcache balance` — from the cache
# (lenders' RAM) and, from a fresh setup, from the disk. One `farcache bench paper --experiment
# migrate` invocation; resumable: the JSON is saved after every configuration, and a rerun
# (`--resume`) keeps the configurations it holds and runs the others. Delete the JSON to start
# over. Results: bench/results/paper001/paper001-hdd.{json,md}.
#   FILES     files of 4 MiB (default 128; the paper's 1024 takes about 8× as long)
#   THREADS   foreground thread counts (default 1,2,3 as in the paper, and 8: a load with enough
#             reads in flight to keep both disks busy, where two disks can show what they give)
#   PHASE     seconds of foreground before and after the migration (default 20)
#   EXTRA     more `bench paper` arguments
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results/paper001}
if [ "$(id -u)" != 0 ]; then
  echo "bench-migrate: needs root (loop devices, cgroups, network namespaces)" >&2
  exit 1
fi
mkdir -p "$OUT"
"$BIN" bench paper --cleanup
# shellcheck disable=SC2086
if ! "$BIN" bench paper --profile hdd --experiment migrate --migrate-files "${FILES:-128}" \
  --migrate-threads "${THREADS:-1,2,3,8}" --migrate-phase-secs "${PHASE:-20}" --resume --out "$OUT" ${EXTRA:-} \
  2>"$OUT/log"; then
  # The JSON holds every configuration that finished (a failed one is recorded with its error);
  # a rerun resumes from it.
  echo "bench-migrate: failed or a check did not pass: see $OUT/log; partial results stay in $OUT/paper001-hdd.json" >&2
  if [ -e "$OUT/paper001-hdd.json" ]; then cp "$OUT/paper001-hdd.json" "$OUT/partial-paper001-hdd.json"; fi
fi
python3 scripts/bench-paper-plot.py "$OUT/paper001-hdd.json" || true
# The experiment's section of the report.
awk '/^## /{p = ($0 ~ /^## migrate/)} p' "$OUT"/paper001-hdd.md 2>/dev/null || true
