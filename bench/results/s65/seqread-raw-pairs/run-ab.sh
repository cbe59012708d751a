#!/bin/bash
# raw seqread 1 GiB, each build's farcache (default routing) against its own passthrough in one
# invocation; builds A (eb820d9: stream probe before the read) and B (a437e9e: after the reply)
# interleaved, the order alternating per round.
for r in $(seq 1 20); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for b in $order; do
    bin=/tmp/farcache-s65a; [ $b = B ] && bin=/tmp/farcache-s65b
    d=/tmp/s65/ab2/$b$r; [ -f $d/paper-raw.json ] && continue; mkdir -p $d
    $bin bench paper --cleanup >/dev/null
    $bin bench paper --profile raw --experiment seqread --sizes 1GiB --configs passthrough,farcache --out $d > $d/log 2>&1
  done
done
