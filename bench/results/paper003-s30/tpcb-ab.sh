#!/bin/bash
# TPC-B with the dram tier, before (060b548) and after (81378dd) the group commit's slots, one round each
cd /work/main
for b in 060b548 81378dd; do
  /tmp/s30/farcache-$b bench paper --profile cloud --experiment pgbench --configs passthrough,tier-dram --pgbench-secs 20 \
    --out bench/results/paper003-s30/tpcb-ab/$b > bench/results/paper003-s30/tpcb-ab/$b.log 2>&1
done
echo DONE > bench/results/paper003-s30/tpcb-ab/DONE
