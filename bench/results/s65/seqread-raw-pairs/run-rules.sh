#!/bin/bash
# raw seqread 1 GiB: farcache with the adaptive rule (default) and with --routing threshold,
# each against its own passthrough in one invocation, alternating which goes first per round.
for r in $(seq 1 20); do
  if [ $((r % 2)) = 1 ]; then order="adaptive threshold"; else order="threshold adaptive"; fi
  for rule in $order; do
    d=/tmp/s65/rt/$rule$r; [ -f $d/paper-raw.json ] && continue; mkdir -p $d
    extra=""; [ $rule = threshold ] && extra="--routing threshold"
    /tmp/farcache-s65b bench paper --cleanup >/dev/null
    /tmp/farcache-s65b bench paper --profile raw --experiment seqread --sizes 1GiB --configs passthrough,farcache $extra --out $d > $d/log 2>&1
  done
done
