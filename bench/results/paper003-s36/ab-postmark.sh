#!/usr/bin/env bash
# A/B of postmark (Table 1's files, a tenth of its transactions, ssd profile) through the dram
# tier: OLD (a flush of each written-back file) against NEW (one syncfs per batch of files),
# interleaved rounds, one `bench paper` each. Results: ab-postmark/<label>-<round>/.
set -euo pipefail
cd "$(dirname "$0")"
OLD=${OLD:?build before the change}
NEW=${NEW:?build with the change}
ROUNDS=${ROUNDS:-1}
CONFIGS=${CONFIGS:-tier-dram}
for r in $(seq 1 "$ROUNDS"); do
  for pair in "old:$OLD" "new:$NEW"; do
    label=${pair%%:*}; bin=${pair#*:}
    out=ab-postmark/$label-$r
    [ -e "$out/paper003-ssd.json" ] && continue
    mkdir -p "$out"
    "$bin" bench paper --cleanup >/dev/null
    "$bin" bench paper --profile ssd --experiment postmark --configs "$CONFIGS" --postmark-scale 0.1 --out "$out" >"$out/log" 2>&1
    grep -E "^paper: \[postmark" "$out/log" | sed "s/^/$label-$r /"
  done
done
