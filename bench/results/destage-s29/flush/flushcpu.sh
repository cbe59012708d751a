#!/bin/bash
# daemon CPU and wall time of `farcache flush` of 512 MiB written into a tier: $3 = randwrite|write;
# TIERDIR: where the tier file goes (/dev/shm: a dram tier; /var/tmp, on the disk: an ssd tier)
# WORK: scratch directory (default ${WORK:-/tmp/s29}); STAT=1: the disk's reads, writes and queue every
# 0.5 s during the flush (dstat.sh, session 30)
B=$1; tag=$2; rw=$3
base=/var${WORK:-/tmp/s29}fc; mnt=${WORK:-/tmp/s29}/mnt; tier=${TIERDIR:-/dev/shm}/s29fc.tier
rm -rf $base $tier; mkdir -p $base $mnt
cat > ${WORK:-/tmp/s29}/noidle.toml <<T
[tier]
idle_destage_after = "0s"
T
$B mount $base $mnt --no-remote --tier $tier --tier-size 2GiB --config ${WORK:-/tmp/s29}/noidle.toml > ${WORK:-/tmp/s29}/fc-$tag.log 2>&1 &
for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.1; done
pid=$(pgrep -f "mount $base $mnt" | head -1)
bs=4k; [ $rw = write ] && bs=1M
fio --name s --directory $mnt --rw $rw --bs $bs --size 512M --ioengine psync --output /dev/null
sync
tick=$(getconf CLK_TCK)
c0=$(awk '{print $14+$15}' /proc/$pid/stat)
t0=$(date +%s.%N)
$B flush $mnt >/dev/null & fp=$!
[ -n "$STAT" ] && "$(dirname "$0")/dstat.sh" $fp
wait $fp; t1=$(date +%s.%N)
c1=$(awk '{print $14+$15}' /proc/$pid/stat)
echo "$tag $rw flush $(echo "$t1 - $t0" | bc) s, daemon cpu $(echo "scale=2; ($c1 - $c0)/$tick" | bc) s"
umount $mnt; wait
rm -rf $base $tier
