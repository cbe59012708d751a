#!/bin/bash
# io_engine uring (default) vs sync through the daemon, interleaved, raw disk, randread and randwrite
cd /work/main
BIN=/tmp/s23/new/farcache
OUT=bench/results/io-engine-sync-s23
for r in 1 2; do
  for v in uring sync; do
    extra=""; [ $v = sync ] && extra="--mount-config /tmp/s23/sync/sync.toml"
    $BIN bench paper --profile raw --experiment engine --configs native,passthrough --engine-qds 1,16,32 --engine-rw randread \
      --engine-interleave --engine-secs 5 $extra --out $OUT/$v-$r > /tmp/s23/sync/$v-$r.log 2>&1
    echo "$v-$r rc $?"
  done
done
cp /tmp/s23/sync/sync.toml $OUT/
touch /tmp/s23/sync/done
