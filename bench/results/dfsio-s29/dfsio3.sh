#!/bin/bash
cd /work/main
out=/work/main/bench/results/dfsio-s29/ssd-final
mkdir -p $out
for r in 1 2; do
  if [ $r = 1 ]; then order="base final"; else order="final base"; fi
  for b in $order; do
    /tmp/s29/farcache-$b bench paper --profile ssd --experiment dfsio --configs native,tier-ssd --out $out/$r-$b > $out/$r-$b.log 2>&1
    /tmp/s29/farcache-$b bench paper --cleanup >/dev/null 2>&1
  done
done
echo done > $out/DONE
