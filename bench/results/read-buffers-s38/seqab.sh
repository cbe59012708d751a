#!/bin/bash
for b in rel 61bbe60 rel 61bbe60; do
  d=/tmp/s38/seqab-$b-$RANDOM; /tmp/s38/farcache-$b bench paper --profile raw --experiment seqread --sizes 1GiB --configs farcache --out $d > $d.log 2>&1
  echo "$b $(grep -o 'pass [12][^,]*MB/s\|pass [12]: [0-9.]* s' $d.log | tr '\n' ' ') $(grep -o '\[seqread farcache[^]]*\] pass [12]:[^,]*,[^,]*' $d.log | tr '\n' ' ')"
done
