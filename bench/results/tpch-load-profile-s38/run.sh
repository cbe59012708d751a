#!/bin/bash
# Profile the whole machine (perf -a -g) during tpch's load test, one configuration per run;
# the run is stopped (SIGTERM: the harness tears down) once the load test is done.
BIN=${BIN:-/tmp/s38/farcache-pool4}
cfg=$1; link=${LINK:-1gbit}
D=/tmp/s38/tpchprof/$cfg-$link; mkdir -p $D
$BIN bench paper --profile cloud --experiment tpch --link $link --configs $cfg --out $D > $D/log 2>&1 &
bp=$!
until grep -q "\[tpch $cfg\] load region" $D/log 2>/dev/null; do sleep 0.2; kill -0 $bp || exit 1; done
perf record -a -g -F 999 -o $D/perf.data > $D/perf.log 2>&1 & pp=$!
# the daemon's pid for the report
pgrep -f "farcache[-a-z0-9]* mount" > $D/daemon.pid
until grep -q "\[tpch $cfg\] load test:" $D/log; do sleep 0.5; kill -0 $bp || break; done
kill -INT $pp; wait $pp
kill -TERM $bp; wait $bp
grep "\[tpch $cfg\] load" $D/log
