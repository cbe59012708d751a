#!/bin/bash
while :; do
  p=$(pgrep -f "pgbench -n -c 16 -j 2 -T" | while read pid; do grep -qa -- "-S" /proc/$pid/cmdline 2>/dev/null || echo $pid; done | head -1)
  [ -n "$p" ] && break; sleep 1
done
sleep 10
perf record -q -e sched:sched_wakeup --filter 'comm == "farcache-remote"' -a --call-graph dwarf,4096 -o /tmp/prof/wake-farc.data -- sleep 5 >/dev/null 2>&1
echo "recorded $(date +%T)"
