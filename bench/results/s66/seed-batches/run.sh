#!/bin/bash
# Raw randread 256 MiB: builds A (before) and B (seeds batched), each round one
# `bench paper --configs passthrough,farcache` invocation per build (order of the configs
# alternating by round), every mount daemon and lender counted by stat-procs.sh.
# Usage: A=/path/farcache-a B=/path/farcache-b ROUNDS=N ./run.sh OUT   (resumable)
here=$(cd "$(dirname "$0")" && pwd); out=$1; mkdir -p "$out"
for r in $(seq 1 "${ROUNDS:-16}"); do
  if [ $((r % 2)) = 1 ]; then cfgs=passthrough,farcache; else cfgs=farcache,passthrough; fi
  for b in A B; do
    bin=${!b}; d=$out/$b/R$r
    [ -f "$d/paper-raw.json" ] && continue
    rm -rf "$d"; mkdir -p "$d"
    "$bin" bench paper --cleanup >/dev/null
    "$here/stat-procs.sh" "$d" "$bin" >/dev/null 2>&1 & w=$!
    sleep 0.3
    "$bin" bench paper --profile raw --experiment randread --sizes 256MiB --configs $cfgs --out "$d" > "$d/log" 2>&1
    sleep 0.5; kill $w; sleep 0.5
  done
done
