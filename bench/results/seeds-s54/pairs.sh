#!/bin/bash
# N pairs of raw seqread 1GiB, alternating order
BIN=${BIN:-/tmp/farcache-s54base}; OUT=${OUT:-/tmp/sq/base}; N=${N:-6}
for i in $(seq 1 $N); do
  d=$OUT/$i; [ -f $d/done ] && continue; mkdir -p $d
  c=passthrough,farcache; [ $((i%2)) -eq 0 ] && c=farcache,passthrough
  $BIN bench paper --profile raw --experiment seqread --sizes 1GiB --configs $c --out $d > $d/log 2>&1 && touch $d/done
done
