#!/bin/bash
# Beside one `bench paper --profile cloud --experiment pgbench --pgbench-clients 1,4` invocation:
# for each configuration's TPC-B run (not -S) at each client count, 5 s in, record the kernel's
# FUSE request tracepoints system-wide for 10 s, then the mount daemon with DWARF call graphs for
# 20 s, and the daemon's CPU ticks over that window. $1 = output directory.
out=$1; mkdir -p "$out"
seen=""
while :; do
  for p in $(pgrep -x pgbench); do
    cl=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)
    case "$cl" in *" -S"*|"") continue;; esac
    c=$(sed -E 's/.* -c ([0-9]+) .*/\1/' <<<"$cl")
    d=$(pgrep -f "farcache-s6[0-9][a-z] mount" | head -1)
    [ -n "$d" ] || continue
    nr=$(pgrep -af "farcache-s6[0-9][a-z] mount" | grep -c -- --no-remote)
    cfg=farcache; [ "$nr" -gt 0 ] && cfg=passthrough
    key="$cfg-c$c"
    case " $seen " in *" $key "*) continue;; esac
    seen="$seen $key"
    echo "$(date +%T) $key pgbench $p: $cl; daemon $d" >> "$out/cpu.txt"
    sleep 5
    perf record -q -e fuse:fuse_request_send -e fuse:fuse_request_end -a -o "$out/fuse-$key.data" -- sleep 10 >/dev/null 2>&1
    s0=$(awk '{print $14+$15}' /proc/$d/stat); t0=$(date +%s.%N)
    perf record -F 499 -g --call-graph dwarf,16384 -o "$out/perf-$key.data" -p "$d" -- sleep 20 2>"$out/perf-$key.log"
    s1=$(awk '{print $14+$15}' /proc/$d/stat); t1=$(date +%s.%N)
    echo "$key daemon cpu ticks $((s1-s0)) over $(echo "$t1-$t0"|bc) s" >> "$out/cpu.txt"
  done
  sleep 1
done
