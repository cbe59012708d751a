#!/usr/bin/env bash
# Paper 003 (the write-back tier, issue 12) reproduced: postmark, dfsio and durable writes in
# native / passthrough / tier-dram / tier-ssd, one `farcache bench paper` invocation per
# experiment on the ssd disk profile (20k IOPS, 500 MB/s). Resumable: an experiment whose JSON
# exists is skipped (delete it to run it again). Results: bench/results/paper003/<experiment>/.
#   EXPERIMENTS      default "durable dfsio destage postmark"
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
for exp in ${EXPERIMENTS:-durable dfsio destage postmark}; do
  dir="$OUT/$exp"
  if ls "$dir"/paper003-*.json >/dev/null 2>&1; then
    echo "== $exp: done before ($dir), skipped"
    continue
  fi
  mkdir -p "$dir"
  echo "== $exp ($PROFILE)"
  # shellcheck disable=SC2086
  "$BIN" bench paper --profile "$PROFILE" --experiment "$exp" --postmark-scale "${POSTMARK_SCALE:-1}" \
    --out "$dir" ${EXTRA:-} >"$dir/log" 2>&1 ||
    { echo "   failed: see $dir/log (what ran is kept as partial-*.json)"; for j in "$dir"/paper003-*.json; do [ -e "$j" ] && mv "$j" "$dir/partial-$(basename "$j")"; done; }
  # The experiment's table (its heading to the next heading).
  awk '/^## /{p = ($0 !~ /memory|Sanity|Targets/)} p' "$dir"/paper003-*.md 2>/dev/null || true
done
