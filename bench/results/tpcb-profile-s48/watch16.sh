#!/bin/bash
# Profile the mount daemon of a full `farcache bench paper --experiment pgbench` job during its
# TPC-B runs at CLIENTS clients (pgbench with `-c CLIENTS` and without -S), after the 1- and
# 4-client runs the job makes first: perf record on the daemon for 20 s, SETTLE s after the run
# starts, then perf stat for 10 s. Once per configuration (RUNS runs in all). Started beside
# the bench; OUT is where the perf data goes.
OUT=${OUT:-/tmp/s48/prof}
SETTLE=${SETTLE:-8}
CLIENTS=${CLIENTS:-16}
RUNS=${RUNS:-2}
mkdir -p "$OUT"
n=0
while [ $n -lt "$RUNS" ]; do
  p=$(pgrep -a -x pgbench | grep -v -- " -S\| -i" | grep -- "-c $CLIENTS " | head -1)
  if [ -n "$p" ]; then
    d=$(pgrep -f "farcache[^ ]* mount" | head -1)
    cfg=$(tr '\0' ' ' </proc/$d/cmdline | grep -q -- "--no-remote" && echo passthrough || echo farcache)
    echo "$(date +%T) tpcb seen: $p ; daemon $d ($cfg)" >> "$OUT/watch.log"
    sleep "$SETTLE"
    perf record -F 1999 -g -o "$OUT/perf-$cfg.data" -p "$d" -- sleep 20 >> "$OUT/watch.log" 2>&1
    perf stat -e task-clock,context-switches,cpu-migrations -p "$d" -- sleep 10 >> "$OUT/stat-$cfg.txt" 2>&1
    while pgrep -a -x pgbench | grep -v -- " -S\| -i" | grep -q -- "-c $CLIENTS "; do sleep 1; done
    n=$((n+1))
  fi
  sleep 1
done
