#!/bin/bash
# interleaved A/B of the destage experiment
cd /work/main
out=/work/main/bench/results/destage-s29
mkdir -p $out
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for b in $order; do
    /tmp/s29/farcache-$b bench paper --profile ssd --experiment destage --configs native,tier-dram --durable-secs 10 --out $out/$r-$b > $out/$r-$b.log 2>&1
    /tmp/s29/farcache-$b bench paper --cleanup >/dev/null 2>&1
  done
done
echo done > $out/DONE
