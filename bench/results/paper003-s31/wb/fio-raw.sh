#!/bin/bash
# dfsio-like 1 MiB writes, JOBS x SIZE (default 8 x 100M; 1 x 800M for one writer), through a
# mount with a tier (dram or ssd) or none; perf of the daemon with PERF=1
set -u
B=${B:-/tmp/s31/farcache-new2}
# Usage: B=BINARY TIER=none|PATH [JOBS=N SIZE=S] [PERF=1] ./fio-raw.sh (root)
W=/var/tmp/s31prof
TIER=${TIER:-/dev/shm/s31prof.tier}
mkdir -p $W/b $W/m
umount -l $W/m 2>/dev/null
rm -rf $W/b/* ; rm -f $TIER
args=(--no-remote)
[ "$TIER" != none ] && args+=(--tier $TIER --tier-size 2GiB)
FARCACHE_LOG=warn $B mount $W/b $W/m "${args[@]}" > $W/mount.log 2>&1 &
MP=$!
for i in $(seq 50); do mountpoint -q $W/m && break; sleep 0.2; done
sleep 1
PID=$(pgrep -f "$(basename $B) mount $W/b" | head -1)
if [ "${PERF:-0}" = 1 ]; then perf record -g -o $W/perf.data -p $PID 2>/dev/null & PP=$!; sleep 0.5; fi
fio --name=w --directory=$W/m --numjobs=${JOBS:-8} --size=${SIZE:-100M} --bs=1M --rw=write --ioengine=psync --end_fsync=1 --group_reporting --output-format=terse 2>/dev/null | awk -F';' '{print "write KB/s", $48}'
[ "${PERF:-0}" = 1 ] && { kill -INT $PP; wait $PP; }
cat /proc/$PID/status | grep -E "voluntary"
kill $MP; wait $MP 2>/dev/null
umount -l $W/m 2>/dev/null
rm -f $TIER
