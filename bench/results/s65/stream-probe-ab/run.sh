#!/bin/bash
# Raw seqread 1 GiB, farcache only, builds A and B alternately; the kernel's FUSE request
# tracepoints recorded system-wide through each run, so that every READ's time through the
# mount is known. Usage: A=/path/to/farcache-a B=/path/to/farcache-b ROUNDS=N ./run.sh OUT
set -euo pipefail
out=$1; mkdir -p "$out"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for b in A B; do
    bin=${!b}; d=$out/$b$r
    [ -f "$d/paper-raw.json" ] && continue
    mkdir -p "$d"
    "$bin" bench paper --cleanup >/dev/null
    perf record -q -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o "$d/fuse.data" >/dev/null 2>&1 &
    p=$!
    sleep 1
    "$bin" bench paper --profile raw --experiment seqread --sizes 1GiB --configs farcache --out "$d" > "$d/log" 2>&1
    kill -INT $p; wait $p || true
  done
done
