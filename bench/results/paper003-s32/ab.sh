#!/bin/bash
# Issue 12, session 32: where did the ssd tier lose in the full run?
# durable: s30's build (060b548, commit = write only) against this session's (2c685b2) with
#   commit = fsync (default) and commit = write; passthrough beside each.
# postmark (a twentieth of Table 1's transactions): s31's last build (0c6d0b4, before the
#   range locks) against 2c685b2; passthrough beside each. Interleaved, resumable per run.
cd /work/main
O=bench/results/paper003-s32/ab
mkdir -p $O
run() { # name, binary, args...
  local n=$1 b=$2; shift 2
  [ -e "$O/$n/DONE" ] && return
  mkdir -p "$O/$n"
  "$b" bench paper "$@" --out "$O/$n" > "$O/$n.log" 2>&1 && touch "$O/$n/DONE"
}
S30=/tmp/s30/farcache-060b548; S31=/tmp/s31/farcache-wb; NEW=/tmp/s32/farcache-2c685b2
for r in 1 2; do
  run durable-$r-s30 $S30 --profile ssd --experiment durable --configs passthrough,tier-ssd
  run durable-$r-fsync $NEW --profile ssd --experiment durable --configs passthrough,tier-ssd
  run durable-$r-write $NEW --profile ssd --experiment durable --configs passthrough,tier-ssd --tier-commit write
done
for r in 1-s31 1-new 2-new 2-s31; do
  case $r in *-s31) B=$S31;; *) B=$NEW;; esac
  run postmark-$r $B --profile ssd --experiment postmark --configs passthrough,tier-ssd --postmark-scale 0.05
done
echo DONE > $O/DONE
