#!/bin/bash
# fio into a dram-tier mount: 800 MiB in 1 MiB writes, then 4 KiB write+fdatasync QD1 for 8 s
B=$1; tag=$2
base=/var/tmp/s29wr; mnt=/tmp/s29/mnt; tier=/dev/shm/s29wr.tier
rm -rf $base $tier; mkdir -p $base $mnt
$B mount $base $mnt --no-remote --tier $tier --tier-size 2GiB --config /tmp/s29/noidle.toml > /tmp/s29/wr-$tag.log 2>&1 &
for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.1; done
bw=$(fio --name s --directory $mnt --rw write --bs 1M --size 800M --ioengine psync --end_fsync=1 --output-format=json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw"]/1024))')
lat=$(fio --name d --directory $mnt --rw randwrite --bs 4k --size 64M --ioengine psync --fdatasync=1 --time_based --runtime 8 --output-format=json | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["write"]; p=j["clat_ns"]["percentile"]; print(round(j["iops"]), round(p["50.000000"]/1000), round(p["99.000000"]/1000))')
echo "$tag write1M ${bw} MiB/s; 4k+fdatasync iops p50 p99: $lat"
umount $mnt; wait
rm -rf $base $tier
