#!/bin/bash
# sched_switch with call graphs of the mount daemon, 10 s into each config's TPC-B 16 run.
TAG=$1
for cfg in pass farc; do
  while :; do
    p=$(pgrep -f "pgbench -n -c 16 -j 2 -T" | while read pid; do grep -qa -- "-S" /proc/$pid/cmdline 2>/dev/null || echo $pid; done | head -1)
    [ -n "$p" ] && break; sleep 1
  done
  sleep 10
  d=$(pgrep -f "farcache-main mount" | head -1)
  perf record -q -e sched:sched_switch --call-graph dwarf,8192 -p $d -o /tmp/prof/sw-$TAG-$cfg.data -- sleep 3 >/dev/null 2>&1
  echo "$cfg recorded $(date +%T) daemon $d"
  while pgrep -f "pgbench -n -c 16 -j 2 -T" >/dev/null; do sleep 1; done
done
