#!/bin/bash
# Issue 12, session 32: the buffered ssd tier drops its pages from the page cache once per
# 8 MiB written (farcache-drop) instead of at every flush (2c685b2); durable on the ssd profile
# and TPC-B (4 and 16 clients) on the cloud profile, passthrough beside each, interleaved.
cd /work/main
O=bench/results/paper003-s32/drop
mkdir -p $O
run() { local n=$1 b=$2; shift 2; [ -e "$O/$n/DONE" ] && return; mkdir -p "$O/$n"
  "$b" bench paper "$@" --out "$O/$n" > "$O/$n.log" 2>&1 && touch "$O/$n/DONE"; }
OLD=/tmp/s32/farcache-2c685b2; NEW=/tmp/s32/farcache-drop
for r in 1-old 1-new 2-new 2-old; do
  case $r in *-old) B=$OLD;; *) B=$NEW;; esac
  run durable-$r $B --profile ssd --experiment durable --configs passthrough,tier-ssd
done
for r in 1-new 1-old; do
  case $r in *-old) B=$OLD;; *) B=$NEW;; esac
  run tpcb-$r $B --profile cloud --experiment pgbench --configs passthrough,tier-ssd --pgbench-secs 20
done
echo DONE > $O/DONE
