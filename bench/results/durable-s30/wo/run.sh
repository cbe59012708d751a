#!/bin/bash
# durable writes through an ssd tier: 81378dd (tier file fallocated) vs wo (written once by the mount, the harness no longer fallocating it), interleaved before, after, after, before
cd /work/main
for r in 1-81378dd 1-wo2 2-wo2 2-81378dd; do
  /tmp/s30/farcache-${r#*-} bench paper --profile ssd --experiment durable --configs tier-ssd --durable-secs 10 \
    --out bench/results/durable-s30/wo/$r > bench/results/durable-s30/wo/$r.log 2>&1
done
echo DONE > bench/results/durable-s30/wo/DONE
