#!/bin/bash
# FUSE request tracepoints (10 s) and perf sched (5 s), 8 s into each config's TPC-B 16-client run.
TAG=$1; here=$(dirname "$0")
for cfg in pass farc; do
  WAIT_AFTER=8 "$here/wait-tpcb.sh"
  perf record -q -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o /tmp/prof/fuse-$TAG-$cfg.data -- sleep 10 >/dev/null 2>&1
  perf sched record -q -a -o /tmp/prof/sched-$TAG-$cfg.data -- sleep 5 >/dev/null 2>&1
  echo "$cfg recorded $(date +%T)"
  while pgrep -f "pgbench -n -c 16 -j 2 -T" >/dev/null; do sleep 1; done
done
