#!/bin/bash
# peak anon of the mount daemon under 32 direct readers of 4k-1m with a lender; env in $@
BIN=${BIN:-/tmp/s38/farcache-rel}
tag=$1; shift
R=${R:-/tmp/s38/syn}; mkdir -p $R /tmp/syn/b /tmp/syn/m
[ -f /tmp/syn/b/f ] || dd if=/dev/urandom of=/tmp/syn/b/f bs=1M count=512 status=none
$BIN server --listen 127.0.0.1:7499 --capacity 1GiB > $R/server.log 2>&1 & sp=$!
sleep 0.5
env "$@" $BIN mount /tmp/syn/b /tmp/syn/m ${MOUNTARGS:---server 127.0.0.1:7499} > $R/$tag.log 2>&1 & mp=$!
for i in $(seq 50); do mountpoint -q /tmp/syn/m && break; sleep 0.1; done
fio --name=r --filename=/tmp/syn/m/f --rw=${RW:-randread} --bsrange=${BS:-4k-1m} --direct=1 --numjobs=32 --time_based --runtime=${SECS:-15} --ioengine=psync --group_reporting --output=$R/$tag.fio >/dev/null 2>&1 & fp=$!
peak=0
while kill -0 $fp 2>/dev/null; do a=$(awk '/RssAnon/{print $2}' /proc/$mp/status); [ "$a" -gt "$peak" ] && peak=$a; sleep 0.2; done
sleep 0.5; $BIN stats /tmp/syn/m --json > $R/$tag.stats.json 2>&1; cat /proc/$mp/smaps_rollup > $R/$tag.rollup; after=$(awk '/RssAnon/{print $2}' /proc/$mp/status)
cpu=$(awk '{print ($14+$15)*10}' /proc/$mp/stat)
bw=$(grep -o "IOPS=[^,]*" $R/$tag.fio | head -1)
echo "$tag peak_anon_MiB $((peak/1024)) after_MiB $((after/1024)) cpu_ms $cpu $bw"
kill $mp; wait $mp 2>/dev/null; kill $sp; wait $sp 2>/dev/null
