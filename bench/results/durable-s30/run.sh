#!/bin/bash
# durable writes, tier-dram and tier-ssd, build A (060b548) vs B (slots), interleaved A B B A
cd /work/main
for r in 1-base 1-slot 2-slot 2-base; do
  b=${r#*-}; bin=/tmp/s30/farcache-060b548; [ $b = slot ] && bin=/tmp/s30/farcache-slot
  $bin bench paper --profile ssd --experiment durable --configs tier-dram,tier-ssd --durable-secs 10 --out /work/main/bench/results/durable-s30/$r > /work/main/bench/results/durable-s30/$r.log 2>&1
done
echo DONE > /work/main/bench/results/durable-s30/DONE
