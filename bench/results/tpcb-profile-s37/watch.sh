#!/bin/bash
# Profile the mount daemon of `farcache bench paper --experiment pgbench` during each TPC-B run
# (pgbench without -S): perf record on it for 20 s, SETTLE s after the run starts (8 for the
# cloud 4-client run, 5 for the raw 1-client one, whose runs last 30 s), then perf stat for 10 s.
# Started beside the bench; OUT is where the perf data goes.
OUT=${OUT:-/tmp/s37/prof/out}
SETTLE=${SETTLE:-8}
n=0
while [ $n -lt 2 ]; do
  p=$(pgrep -a -x pgbench | grep -v -- " -S\| -i" | head -1)
  if [ -n "$p" ]; then
    d=$(pgrep -f "farcache[^ ]* mount" | head -1)
    cfg=$(tr '\0' ' ' </proc/$d/cmdline | grep -q -- "--no-remote" && echo passthrough || echo farcache)
    echo "$(date +%T) tpcb seen: $p ; daemon $d ($cfg)" >> $OUT/watch.log
    sleep "$SETTLE"
    perf record -F 1999 -g -o $OUT/perf-$cfg.data -p $d -- sleep 20 >> $OUT/watch.log 2>&1
    perf stat -e task-clock,context-switches,cpu-migrations -p $d -- sleep 10 >> $OUT/stat-$cfg.txt 2>&1
    while pgrep -a -x pgbench | grep -v -- " -S\| -i" | grep -q .; do sleep 1; done
    n=$((n+1))
  fi
  sleep 1
done
