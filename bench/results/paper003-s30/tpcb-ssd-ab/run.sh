#!/bin/bash
# TPC-B through an ssd tier: before (81378dd, the tier file fallocated: unwritten extents) and after (written once), one round each
cd /work/main
for b in 81378dd wo; do
  /tmp/s30/farcache-$b bench paper --profile cloud --experiment pgbench --configs passthrough,tier-ssd --pgbench-secs 20 \
    --out bench/results/paper003-s30/tpcb-ssd-ab/$b > bench/results/paper003-s30/tpcb-ssd-ab/$b.log 2>&1
done
echo DONE > bench/results/paper003-s30/tpcb-ssd-ab/DONE
