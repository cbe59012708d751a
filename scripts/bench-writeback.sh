#!/usr/bin/env bash
# Paper 003 (the write-back tier, issue 12) reproduced: postmark, dfsio, durable writes and
# destage in native / passthrough / tier-dram / tier-ssd, one `farcache bench paper` invocation
# per experiment on the ssd disk profile (20k IOPS, 500 MB/s); then `tpcb`, pgbench on the cloud
# profile (passthrough / tier-dram / tier-ssd / farcache-tier: issue 12's "TPC-B with the
# tier"). Resumable: an experiment whose JSON exists is skipped (delete it to run it again).
# Results and plots: bench/results/paper003/<experiment>/.
#   EXPERIMENTS      default "durable dfsio destage postmark tpcb"
#   PROFILE          default ssd
#   POSTMARK_SCALE   share of Table 1's transactions (default 1: the paper's; the files, the
#                    working set, stay the paper's)
#   EXTRA            more `bench paper` arguments
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results/paper003}
PROFILE=${PROFILE:-ssd}
if [ "$(id -u)" != 0 ]; then
  echo "bench-writeback: needs root (loop devices, cgroups)" >&2
  exit 1
fi
"$BIN" bench paper --cleanup
for exp in ${EXPERIMENTS:-durable dfsio destage postmark tpcb}; do
  dir="$OUT/$exp"
  if ls "$dir"/paper*.json >/dev/null 2>&1; then
    echo "== $exp: done before ($dir), skipped"
    continue
  fi
  mkdir -p "$dir"
  if [ "$exp" = tpcb ]; then
    echo "== tpcb (cloud): pgbench with the tier"
    args=(--profile cloud --experiment pgbench --configs passthrough,tier-dram,tier-ssd,farcache-tier
      --pgbench-secs "${PGBENCH_SECS:-30}")
  else
    echo "== $exp ($PROFILE)"
    args=(--profile "$PROFILE" --experiment "$exp" --postmark-scale "${POSTMARK_SCALE:-1}")
  fi
  # shellcheck disable=SC2086
  "$BIN" bench paper "${args[@]}" --out "$dir" ${EXTRA:-} >"$dir/log" 2>&1 ||
    { echo "   failed: see $dir/log (what ran is kept as partial-*.json)"; for j in "$dir"/paper*.json; do [ -e "$j" ] && mv "$j" "$dir/partial-$(basename "$j")"; done; }
  # The experiment's table (its heading to the next heading), and its plots.
  awk '/^## /{p = ($0 !~ /memory|Sanity|Targets/)} p' "$dir"/paper*.md 2>/dev/null || true
  for j in "$dir"/paper*.json; do [ -e "$j" ] && python3 scripts/bench-paper-plot.py "$j"; done
done
