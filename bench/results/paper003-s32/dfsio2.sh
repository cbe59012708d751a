#!/bin/bash
# dfsio (ssd profile): the stripe locks (farcache-cut) against the range locks (farcache-ranges),
# both with the default cutoff; and the range locks with the cutoff off; interleaved
cd /work/main
O=bench/results/paper003-s32/dfsio2
mkdir -p $O
for r in 1-stripes 1-ranges 1-rangesoff 2-rangesoff 2-ranges 2-stripes 3-stripes 3-ranges 3-rangesoff; do
  [ -e $O/$r/DONE ] && continue
  mkdir -p $O/$r
  case $r in *-stripes) B=cut; X="";; *-rangesoff) B=ranges; X="--tier-sequential-cutoff 0";; *) B=ranges; X="";; esac
  /tmp/s32/farcache-$B bench paper --profile ssd --experiment dfsio --configs passthrough,tier-ssd,tier-dram $X --out $O/$r > $O/$r.log 2>&1 && touch $O/$r/DONE
done
echo DONE > $O/DONE
