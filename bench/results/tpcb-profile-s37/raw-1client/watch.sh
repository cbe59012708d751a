#!/bin/bash
OUT=${OUT:-/tmp/s37/prof1/out}
n=0
while [ $n -lt 2 ]; do
  p=$(pgrep -a -x pgbench | grep -v -- " -S\| -i" | head -1)
  if [ -n "$p" ]; then
    d=$(pgrep -f "farcache[^ ]* mount" | head -1)
    cfg=$(tr '\0' ' ' </proc/$d/cmdline | grep -q -- "--no-remote" && echo passthrough || echo farcache)
    echo "$(date +%T) tpcb seen: $p ; daemon $d ($cfg)" >> $OUT/watch.log
    sleep 5
    perf record -F 1999 -g -o $OUT/perf-$cfg.data -p $d -- sleep 20 >> $OUT/watch.log 2>&1
    perf stat -e task-clock,context-switches,cpu-migrations -p $d -- sleep 10 >> $OUT/stat-$cfg.txt 2>&1
    while pgrep -a -x pgbench | grep -v -- " -S\| -i" | grep -q .; do sleep 1; done
    n=$((n+1))
  fi
  sleep 1
done
