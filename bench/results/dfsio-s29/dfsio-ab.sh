#!/bin/bash
# dfsio with native and an ssd tier, builds A and B (/tmp/s29/farcache-A, -B) in two rounds of
# alternating order, into OUT: ssd-final = "base final", ssd-depth = "final depth"
A=$1; B=$2; out=/work/main/bench/results/dfsio-s29/$3
mkdir -p $out
for r in 1 2; do
  if [ $r = 1 ]; then order="$A $B"; else order="$B $A"; fi
  for b in $order; do
    /tmp/s29/farcache-$b bench paper --profile ssd --experiment dfsio --configs native,tier-ssd --out $out/$r-$b > $out/$r-$b.log 2>&1
    /tmp/s29/farcache-$b bench paper --cleanup >/dev/null 2>&1
  done
done
echo done > $out/DONE
