#!/bin/bash
# Profile the whole machine (perf -a -g) during tpch's power test, one configuration per run
# (raw profile, 1 Gbit/s); the mount's stats are taken as the power test ends, and the run is
# stopped (SIGTERM: the harness tears down) there.
BIN=${BIN:-/tmp/s39/farcache-huge}
cfg=$1; prof=${PROF:-raw}
D=${OUT:-/tmp/s39/tpchprof}/$cfg-$prof; mkdir -p $D
$BIN bench paper --profile $prof --experiment tpch --configs $cfg --out $D > $D/log 2>&1 &
bp=$!
until grep -q "\[tpch $cfg\] load test:" $D/log 2>/dev/null; do sleep 0.2; kill -0 $bp || exit 1; done
perf record -a -g -F 499 -o $D/perf.data > $D/perf.log 2>&1 & pp=$!
mp=$(pgrep -f "farcache[-a-z0-9]* mount" | head -1); echo $mp > $D/daemon.pid
mnt=$(tr '\0' '\n' < /proc/$mp/cmdline | grep '^/' | sed -n 3p)
echo "$mnt" > $D/mountpoint
[ "$cfg" = farcache ] && $BIN stats "$mnt" --json > $D/stats-before.json 2>&1
until grep -q "\[tpch $cfg\] power test:" $D/log; do sleep 0.5; kill -0 $bp || break; done
kill -INT $pp
[ "$cfg" = farcache ] && $BIN stats "$mnt" --json > $D/stats-after.json 2>&1
wait $pp
kill -TERM $bp; wait $bp
grep "\[tpch $cfg\] \(load test\|power test\)" $D/log
perf report -i $D/perf.data --stdio --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 > $D/by-comm.txt
