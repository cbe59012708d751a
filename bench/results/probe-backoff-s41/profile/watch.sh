#!/bin/bash
# perf record the mount daemon for 15 s, 8 s into each select-only pgbench run (pgbench -S), both configurations
OUT=/tmp/s41/prof; n=0
while [ $n -lt 2 ]; do
  p=$(pgrep -a -x pgbench | grep -- " -S" | head -1)
  if [ -n "$p" ]; then
    d=$(pgrep -f "farcache[^ ]* mount" | head -1)
    cfg=$(tr '\0' ' ' </proc/$d/cmdline | grep -q -- "--no-remote" && echo passthrough || echo farcache)
    echo "$(date +%T) select-only seen; daemon $d ($cfg)" >> $OUT/watch.log
    sleep 8
    perf record -F 999 -g -o $OUT/perf-$cfg.data -p $d -- sleep 15 >> $OUT/watch.log 2>&1
    while pgrep -a -x pgbench | grep -q -- " -S"; do sleep 1; done
    n=$((n+1))
  fi
  sleep 0.5
done
