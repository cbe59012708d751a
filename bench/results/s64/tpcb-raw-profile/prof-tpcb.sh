#!/bin/bash
# profile the mount daemon during the TPC-B run (4 clients) of each configuration; $1 = out dir
out=$1; mkdir -p $out
seen=""
while :; do
  for p in $(pgrep -x pgbench); do
    cl=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)
    case "$cl" in *"-c 4 "*) ;; *) continue;; esac
    case "$cl" in *" -S"*|"") continue;; esac
    d=$(pgrep -f "farcache-s64[a-z] mount" | head -1)
    nr=$(pgrep -af "farcache-s64[a-z] mount" | grep -c -- --no-remote)
    cfg=farcache; [ "$nr" -gt 0 ] && cfg=passthrough
    case " $seen " in *" $cfg "*) continue;; esac
    seen="$seen $cfg"
    echo "$(date +%T) $cfg pgbench $p: $cl; daemon $d" >> $out/cpu.txt
    sleep 5
    s0=$(awk '{print $14+$15}' /proc/$d/stat); t0=$(date +%s.%N)
    perf record -F 499 -g --call-graph dwarf,16384 -o $out/perf-$cfg.data -p $d -- sleep 30 2>$out/perf-$cfg.log
    s1=$(awk '{print $14+$15}' /proc/$d/stat); t1=$(date +%s.%N)
    echo "$cfg daemon cpu ticks $((s1-s0)) over $(echo "$t1-$t0"|bc) s" >> $out/cpu.txt
  done
  sleep 1
done
