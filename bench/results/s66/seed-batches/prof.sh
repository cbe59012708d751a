#!/bin/bash
# Beside one bench paper invocation: perf record -F 2999 (no call graphs) of each mount daemon of
# binary $2 from its start to its exit, into $1/perf-CONFIG-PID.data.
out=$1; bin=$2; mkdir -p "$out"; seen=""
while :; do
  for d in $(pgrep -f "$bin mount"); do
    case " $seen " in *" $d "*) continue;; esac
    seen="$seen $d"
    cfg=farcache; tr '\0' ' ' < /proc/$d/cmdline | grep -q -- --no-remote && cfg=passthrough
    perf record -F 2999 -o "$out/perf-$cfg-$d.data" -p "$d" 2>/dev/null >/dev/null &
  done
  sleep 0.05
done
