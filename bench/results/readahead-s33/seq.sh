#!/usr/bin/env bash
# dd bs=8k of a 1 GiB file through `farcache mount --no-remote`, page caches dropped before each, per window
cd /tmp/s33
B=${B:-/tmp/s33/farcache-a75f6f9}
setsid $B mount --no-remote b m > seqmount.log 2>&1 &
for i in $(seq 50); do mountpoint -q m && break; sleep 0.2; done
dev=$(mountpoint -d m)
for round in 1 2 3; do
  for ra in 128 256 512 1024; do
    echo $ra > /sys/class/bdi/$dev/read_ahead_kb; sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N); dd if=m/f of=/dev/null bs=8k status=none; e=$(date +%s.%N)
    echo "round $round window ${ra}KiB: $(echo "$e - $s" | bc) s"
  done
done
fusermount3 -u m
