#!/bin/bash
# usage: run.sh BIN RATE(none|1gbit|10gbit) LABEL
BIN=$1; RATE=$2; L=$3
D=/tmp/mem/$L; rm -rf $D; mkdir -p $D/back $D/mnt
[ -f /tmp/mem/data.bin ] || head -c 1G /dev/urandom > /tmp/mem/data.bin
ln /tmp/mem/data.bin $D/back/data.bin 2>/dev/null || cp /tmp/mem/data.bin $D/back/
$BIN server --listen 127.0.0.1:0 --capacity 2GiB > $D/server.log 2>&1 &
SP=$!
for i in $(seq 50); do ADDR=$(grep -o '127.0.0.1:[0-9]*' $D/server.log | head -1); [ -n "$ADDR" ] && break; sleep 0.1; done
$BIN mount $D/back $D/mnt --server $ADDR --routing threshold > $D/mount.log 2>&1 &
MP=$!
for i in $(seq 100); do mountpoint -q $D/mnt && break; sleep 0.1; done
[ "$RATE" != none ] && tc qdisc add dev lo root tbf rate $RATE burst 256kb latency 20ms
for s in 1 2 3 4 5 6 7 8; do $BIN randread $D/mnt/data.bin --size 128MiB --passes 1 --seed $s > $D/rr$s.log 2>&1 & done
PIDS=$(jobs -p | tail -8)
t=0
while pgrep -f "randread $D/mnt" > /dev/null; do
  A=$(awk '/^Anonymous/{print $2}' /proc/$MP/smaps_rollup)
  F=$($BIN stats $D/mnt 2>/dev/null | grep -o '[0-9]* in flight[^,]*')
  echo "t=$t anon_kB=$A $F" >> $D/samples; t=$((t+2)); sleep 2
  [ $t -gt 400 ] && break
done
[ "$RATE" != none ] && tc qdisc del dev lo root
sleep 5
A=$(awk '/^Anonymous/{print $2}' /proc/$MP/smaps_rollup)
echo "drained anon_kB=$A" >> $D/samples
$BIN stats $D/mnt > $D/stats.txt 2>&1
cat $D/rr*.log | grep -i "pass" | head -8 > $D/passes
fusermount3 -u $D/mnt || umount -l $D/mnt; wait $MP; kill $SP; wait $SP
