#!/usr/bin/env bash
# A/B of the durable experiment through the dram tier: session 35's build (OLD) against this
# session's (NEW), interleaved rounds, one `bench paper` each. Results: ab-durable/<label>-<round>/.
set -euo pipefail
cd "$(dirname "$0")"
OLD=${OLD:?session 35 build}
NEW=${NEW:?this session build}
ROUNDS=${ROUNDS:-3}
for r in $(seq 1 "$ROUNDS"); do
  for pair in "old:$OLD" "new:$NEW"; do
    label=${pair%%:*}; bin=${pair#*:}
    out=ab-durable/$label-$r
    [ -e "$out/paper003-ssd.json" ] && continue
    mkdir -p "$out"
    "$bin" bench paper --cleanup >/dev/null
    "$bin" bench paper --profile ssd --experiment durable --configs passthrough,tier-dram --out "$out" >"$out/log" 2>&1
    grep -E "^\| (1 writer|32 writers)" "$out"/paper003-ssd.md | sed "s/^/$label-$r /"
  done
done
