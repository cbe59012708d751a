#!/bin/bash
# raw randread 256 MiB, build 34400ae: farcache (default routing) against the passthrough in one
# invocation per pair, back to back, 16 pairs, the order alternating.
for r in $(seq 1 16); do
  if [ $((r % 2)) = 1 ]; then cfgs=passthrough,farcache; else cfgs=farcache,passthrough; fi
  d=/tmp/s65/rr2/B$r; [ -f $d/paper-raw.json ] && continue; mkdir -p $d
  /tmp/farcache-s65b bench paper --cleanup >/dev/null
  /tmp/farcache-s65b bench paper --profile raw --experiment randread --sizes 256MiB --configs $cfgs --out $d > $d/log 2>&1
done
