#!/usr/bin/env bash
# Paper 004 (issue 13) reproduced: three PostgreSQL tenants — each with its own loop-device disk
# (the cloud profile: 3000 IOPS, 125 MB/s), its own memory cgroup and its own `farcache mount
# --tenant tenantN` — sharing one lender (`farcache server`) started with each allocation mode
# in turn (shared, static, hit-ratio, mrc). TPC-H Q4, RUNS times per tenant, the three at once,
# at scale factors in the ratio 1:2:3; the lender lends a share of the three databases' total
# size (0.38: the paper's memory-to-data ratio). One `farcache bench paper --experiment tenants`
# invocation; resumable: the JSON is saved after every (capacity, mode) point, and a rerun keeps
# the points it holds. Delete the JSON to start over. Results:
# bench/results/paper004/paper004-cloud.{json,md} and paper004-cloud-tenants-<share>.png.
#   SF        scale factors (default 0.25,0.5,0.75: the paper's)
#   RUNS      runs of Q4 per tenant (default 10: the paper's)
#   CAPACITY  lender capacity points as shares of the databases (default 0.38,0.2,0.6)
#   EXTRA     more `bench paper` arguments
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results/paper004}
if [ "$(id -u)" != 0 ]; then
  echo "bench-tenants: needs root (loop devices, cgroups, network namespaces)" >&2
  exit 1
fi
mkdir -p "$OUT"
"$BIN" bench paper --cleanup
# shellcheck disable=SC2086
if ! "$BIN" bench paper --profile cloud --experiment tenants --tenants-sf "${SF:-0.25,0.5,0.75}" \
  --tenants-runs "${RUNS:-10}" --tenants-capacity "${CAPACITY:-0.38,0.2,0.6}" --out "$OUT" ${EXTRA:-} \
  2>"$OUT/log"; then
  # The JSON holds every point that finished (a failed one is recorded with its error, and run
  # again by a rerun).
  echo "bench-tenants: failed or a check did not pass: see $OUT/log; partial results stay in $OUT/paper004-cloud.json" >&2
  if [ -e "$OUT/paper004-cloud.json" ]; then cp "$OUT/paper004-cloud.json" "$OUT/partial-paper004-cloud.json"; fi
fi
python3 scripts/bench-paper-plot.py "$OUT/paper004-cloud.json" || true
# The experiment's section of the report.
awk '/^## /{p = ($0 ~ /^## tenants/)} p' "$OUT"/paper004-cloud.md 2>/dev/null || true
