#!/bin/bash
# Beside a `bench paper` run: `perf stat --per-thread` (task clock, context switches, system
# calls) of every mount daemon and lender server of binary $2 from its start to its exit,
# one file per process in $1. Counting only: no sampling overhead.
out=$1; bin=$2; mkdir -p "$out"; seen=""
while :; do
  for d in $(pgrep -f "$bin (mount|server)"); do
    case " $seen " in *" $d "*) continue;; esac
    seen="$seen $d"
    kind=mount; tr '\0' ' ' < /proc/$d/cmdline | grep -q " server" && kind=server
    cfg=farcache; tr '\0' ' ' < /proc/$d/cmdline | grep -q -- --no-remote && cfg=passthrough
    perf stat --per-thread -e task-clock,context-switches,raw_syscalls:sys_enter -p "$d" \
      -o "$out/stat-$kind-$cfg-$d.txt" &
  done
  sleep 0.05
done
