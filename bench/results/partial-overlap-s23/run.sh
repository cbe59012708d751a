#!/bin/bash
# partial-hit A/B: A=old build, B=new; each 8 KiB read = one lender block + one disk block
set -u
OUT=/tmp/s23/ph/out; mkdir -p $OUT
D=/var/tmp/s23ph; mkdir -p $D/b $D/m
SIZE=$((256<<20))
[ -f $D/b/f ] || { head -c $SIZE /dev/urandom > $D/b/f; sync; }
printf '[cache]\nrouting = "threshold"\nread_around = "4KiB"\n' > $D/cfg.toml
for round in 1 2 3; do
  if [ $round = 2 ]; then order="B A"; else order="A B"; fi
  for v in $order; do
    if [ $v = A ]; then BIN=/tmp/s23/bin/farcache; else BIN=/tmp/s23/new/farcache; fi
    $BIN server --listen 127.0.0.1:0 --capacity 1GiB > $D/srv.addr 2>$D/srv.log &
    SP=$!; sleep 1; ADDR=$(grep -oE '127.0.0.1:[0-9]+' $D/srv.addr | head -1)
    $BIN mount $D/b $D/m --server $ADDR --config $D/cfg.toml > $D/mount.log 2>&1 &
    MP=$!
    for i in $(seq 50); do mountpoint -q $D/m && break; sleep 0.2; done
    python3 /tmp/s23/ph/prime.py $D/m/f $SIZE
    sleep 3
    $BIN stats $D/m --json > $OUT/$round-$v-before.json
    fio --name=ph --filename=$D/m/f --rw=randread --bs=8k --direct=1 --ioengine=psync --size=$SIZE \
        --output-format=json --output=$OUT/$round-$v.fio.json > /dev/null
    $BIN stats $D/m --json > $OUT/$round-$v-after.json
    fusermount3 -u $D/m 2>/dev/null || umount $D/m; wait $MP; kill $SP; wait $SP
    python3 - $OUT/$round-$v <<'PY'
import json,sys
p=sys.argv[1]; f=json.load(open(p+'.fio.json'))['jobs'][0]['read']
a=json.load(open(p+'-after.json')); b=json.load(open(p+'-before.json'))
e=lambda d,k: d['engine'].get(k,0)
print(p.split('/')[-1], 'iops %.0f p50 %.0f us mean %.0f us' % (f['iops'], f['clat_ns']['percentile']['50.000000']/1000, f['clat_ns']['mean']/1000),
  'partial', e(a,'partial_hits')-e(b,'partial_hits'), 'overlapped', e(a,'partial_overlapped')-e(b,'partial_overlapped'),
  'remote_reads', e(a,'remote_reads')-e(b,'remote_reads'), 'disk_reads', e(a,'disk_reads')-e(b,'disk_reads'))
PY
  done
done
