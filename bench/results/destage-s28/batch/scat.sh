#!/bin/bash
# time the flush of 16,384 scattered dirty 4 KiB blocks of a 1 GiB file (tier on /dev/shm, backing on /var/tmp)
B=$1; tag=$2
base=/var/tmp/s28scat; mnt=/tmp/s28/mnt; tier=/dev/shm/s28scat.tier
rm -rf $base $tier; mkdir -p $base $mnt
fallocate -l 1G $base/f 2>/dev/null || dd if=/dev/zero of=$base/f bs=1M count=1024 status=none
sync
$B mount $base $mnt --no-remote --tier $tier --tier-size 1GiB > /tmp/s28/scat-$tag.log 2>&1 &
for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.1; done
fio --name s --filename $mnt/f --rw randwrite --bs 4k --size 1G --io_size 64M --ioengine psync --randrepeat 1 --norandommap --output /dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
t0=$(date +%s.%N); $B flush $mnt >/dev/null; t1=$(date +%s.%N)
echo "$tag flush $(echo "$t1 - $t0" | bc) s"
umount $mnt; wait
rm -rf $base $tier
