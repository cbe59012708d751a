#!/bin/bash
# Cloud pgbench TPC-B at 4 clients, 60 s: builds A and B, one `bench paper --configs
# passthrough,farcache` invocation each, every mount daemon and lender counted by
# stat-procs.sh. Usage: A=... B=... ./run-tpcb.sh OUT   (resumable)
here=$(cd "$(dirname "$0")" && pwd); out=$1; mkdir -p "$out"
for b in A B; do
  bin=${!b}; d=$out/tpcb-$b
  [ -f "$d/paper-cloud.json" ] && continue
  rm -rf "$d"; mkdir -p "$d"
  "$bin" bench paper --cleanup >/dev/null
  "$here/stat-procs.sh" "$d" "$bin" >/dev/null 2>&1 & w=$!
  sleep 0.3
  "$bin" bench paper --profile cloud --experiment pgbench --pgbench-clients 4 --pgbench-secs 60 \
    --configs passthrough,farcache --out "$d" > "$d/log" 2>&1
  sleep 0.5; kill $w; sleep 0.5
done
