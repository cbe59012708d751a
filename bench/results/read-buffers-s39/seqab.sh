#!/bin/bash
# usage: seqab.sh ROUNDS bin1 bin2 ...   (binaries /tmp/s39/farcache-NAME)
rounds=$1; shift
for r in $(seq $rounds); do for b in "$@"; do
  d=/tmp/s39/seqab-$b-$r; /tmp/s39/farcache-$b bench paper --profile raw --experiment seqread --sizes 1GiB --configs farcache --out $d > $d.log 2>&1
  echo "$b $r $(grep -o '\[seqread farcache[^]]*\] pass [12]:[^,]*,[^,]*' $d.log | tr '\n' ' ')" >> /tmp/s39/seqab.txt
done; done
echo done >> /tmp/s39/seqab.txt
