#!/bin/bash
# run.sh BIN TAG CFG(p|f) [SIZE]: one randread pass through a fresh mount, daemon CPU measured
set -e
BIN=$1; TAG=$2; CFG=$3; SIZE=${4:-1GiB}; PASSES=${PASSES:-1}
cd /tmp/pe
mnt=/tmp/pe/mnt-$CFG
if [ $CFG = f ]; then
  $BIN server --config server.toml > server.out 2> server.log & SPID=$!
  for i in $(seq 100); do grep -q "listening on" server.out && break; sleep 0.1; done
  addr=$(sed -n 's/.*listening on //p' server.out)
  args="--server $addr"
else
  args="--no-remote"
fi
$BIN mount /tmp/pe/ext4 $mnt $args > mount.out 2> mount-$TAG.log & MPID=$!
for i in $(seq 100); do grep -q "farcache mounted" mount.out && break; sleep 0.1; done
echo 3 > /proc/sys/vm/drop_caches
if [ -n "$REC" ]; then perf record -F 2999 -e cpu-clock --call-graph dwarf,16384 -p $MPID -o rec-$TAG.data 2>/dev/null & PP=$!; else perf stat -e task-clock,context-switches,cpu-migrations -p $MPID -o perf-$TAG.txt & PP=$!; fi
sleep 0.3
read u0 s0 < <(awk '{print $14, $15}' /proc/$MPID/stat)
out=$($BIN randread $mnt/f --passes $PASSES --size $SIZE --seed 3 --json 2>/dev/null)
read u1 s1 < <(awk '{print $14, $15}' /proc/$MPID/stat)
kill -INT $PP; wait $PP || true
$BIN stats $mnt --json > stats-$TAG.json 2>/dev/null || true
fusermount3 -u $mnt; wait $MPID || true
[ -n "$SPID" ] && { kill $SPID; wait $SPID || true; }
echo "$TAG $CFG utime=$((u1-u0)) stime=$((s1-s0)) $(echo $out | python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("pass%d=%.0fiops/p50=%s" % (i+1, p["reads_per_sec"], p["p50_us"]) for i,p in enumerate(d["passes"])))' 2>/dev/null || echo "$out" | head -c 300) $(grep -E 'task-clock|context-switches' perf-$TAG.txt | awk '{printf "%s=%s ", $2, $1}')"
