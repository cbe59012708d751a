#!/bin/bash
# sched_switch with call graphs of the mount daemon, 10 s into each config's TPC-B 16 run.
TAG=$1; here=$(dirname "$0")
for cfg in pass farc; do
  WAIT_AFTER=10 "$here/wait-tpcb.sh"
  d=$(pgrep -f "farcache-main mount" | head -1)
  perf record -q -e sched:sched_switch --call-graph dwarf,8192 -p $d -o /tmp/prof/sw-$TAG-$cfg.data -- sleep 3 >/dev/null 2>&1
  echo "$cfg recorded $(date +%T) daemon $d"
  while pgrep -f "pgbench -n -c 16 -j 2 -T" >/dev/null; do sleep 1; done
done
