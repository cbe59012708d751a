#!/bin/bash
# dfsio (ssd profile): tier.sequential_cutoff 0 (every write to the tier) vs the default 4MiB, interleaved
cd /work/main
O=bench/results/paper003-s32/dfsio
mkdir -p $O
for r in 1-off 1-cut 2-cut 2-off 3-off 3-cut; do
  [ -e $O/$r/DONE ] && continue
  mkdir -p $O/$r
  case $r in *-off) X="--tier-sequential-cutoff 0";; *) X="";; esac
  /tmp/s32/farcache-cut bench paper --profile ssd --experiment dfsio --configs passthrough,tier-ssd,tier-dram $X --out $O/$r > $O/$r.log 2>&1 && touch $O/$r/DONE
done
echo DONE > $O/DONE
