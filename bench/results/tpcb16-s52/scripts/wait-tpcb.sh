#!/bin/bash
# Return once a TPC-B-like pgbench run at 16 clients (no -S) is running; WAIT_AFTER seconds more.
while :; do
  p=$(pgrep -f "pgbench -n -c 16 -j 2 -T" | while read -r pid; do grep -qa -- "-S" /proc/$pid/cmdline 2>/dev/null || echo $pid; done | head -1)
  [ -n "$p" ] && break; sleep 1
done
sleep "${WAIT_AFTER:-0}"
