#!/bin/bash
# usage: pst.sh ROUNDS bin...: seqread raw 1 GiB under perf stat (block requests), results in pst.txt
rounds=$1  # binaries: /tmp/s39/farcache-{before,pool,huge} (release builds of d6c1e00, a50e41c, this change); shift
for r in $(seq $rounds); do for b in "$@"; do
  d=/tmp/s39/pst-$b-$r; perf stat -a -e block:block_rq_issue,block:block_split,block:block_bio_queue -o $d.perf -- /tmp/s39/farcache-$b bench paper --profile raw --experiment seqread --sizes 1GiB --configs farcache --out $d > $d.log 2>&1
  echo "$b $r $(grep -h 'ran both passes' $d.log | grep -o '[0-9.]* s, [0-9.]* s') $(grep -E 'block|elapsed' $d.perf | awk '{print $1, $2}' | tr '\n' ' ')" >> /tmp/s39/pst.txt
done; done; echo done >> /tmp/s39/pst.txt
