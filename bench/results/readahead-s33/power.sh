#!/usr/bin/env bash
# tpch's load and power tests only (the throughput test is stopped: it takes 20 min through
# the passthrough), with the mount's readahead window at 1 MiB (a) and 128 KiB (b).
# Usage: sudo BIN=... CFGS=farcache LINK=10gbit VARIANTS="b a" [ROUND=2] bench/results/readahead-s33/power.sh
set -u
cd "$(dirname "$0")/../../.."
BIN=${BIN:-target/release/farcache}; CFGS=${CFGS:-farcache}; LINK=${LINK:-10gbit}; VARIANTS=${VARIANTS:-"b a"}
here=bench/results/readahead-s33
for v in $VARIANTS; do
  d=$here/power${ROUND:-}-$CFGS-$LINK-$v; mkdir -p "$d"
  grep -q "power test:" "$d/log" 2>/dev/null && continue
  echo "== $CFGS $LINK $v $(date +%T)"
  setsid "$BIN" bench paper --profile cloud --link "$LINK" --experiment tpch --configs "$CFGS" \
    --mount-config "$here/$v.toml" --out "$d" >"$d/log" 2>&1 &
  pid=$!
  while kill -0 $pid 2>/dev/null; do
    grep -q "\] power test:" "$d/log" && { sleep 2; kill -INT -- -$pid; wait $pid; break; }
    sleep 5
  done
  "$BIN" bench paper --cleanup >/dev/null 2>&1
  grep "load test:\|power test:\|q5:\|q7:\|q9:\|q21:" "$d/log"
done
