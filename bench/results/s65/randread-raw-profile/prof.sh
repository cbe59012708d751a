#!/bin/bash
# Beside one `bench paper --profile raw --experiment randread --sizes 256MiB --configs
# passthrough,farcache` invocation: record each configuration's mount daemon from the moment it
# appears until it exits (both passes; pass 2 of 256 MiB is served by the page cache, so the
# samples are pass 1's), DWARF call graphs at 999 Hz. $1 = output directory.
out=$1; mkdir -p "$out"; seen=""
while :; do
  for d in $(pgrep -f "farcache-s6[0-9][a-z] mount"); do
    case " $seen " in *" $d "*) continue;; esac
    seen="$seen $d"
    cfg=farcache; tr '\0' ' ' < /proc/$d/cmdline | grep -q -- --no-remote && cfg=passthrough
    echo "$(date +%T) $cfg daemon $d" >> "$out/daemons.txt"
    perf record -F 999 -g --call-graph dwarf,8192 -o "$out/perf-$cfg.data" -p "$d" 2>"$out/perf-$cfg.log" &
  done
  sleep 0.2
done
