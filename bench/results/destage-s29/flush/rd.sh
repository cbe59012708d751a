#!/bin/bash
# read back 800 MiB held dirty in a dram tier, page cache dropped: MB/s
B=$1; tag=$2
base=/var/tmp/s29rd; mnt=/tmp/s29/mnt; tier=/dev/shm/s29rd.tier
rm -rf $base $tier; mkdir -p $base $mnt
$B mount $base $mnt --no-remote --tier $tier --tier-size 2GiB --config /tmp/s29/noidle.toml > /tmp/s29/rd-$tag.log 2>&1 &
for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.1; done
fio --name s --directory $mnt --rw write --bs 1M --size 800M --ioengine psync --output /dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
r=$(dd if=$mnt/s.0.0 of=/dev/null bs=1M 2>&1 | tail -1 | awk '{print $(NF-1), $NF}')
echo "$tag read $r"
umount $mnt; wait
rm -rf $base $tier
