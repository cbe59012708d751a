#!/bin/bash
# tpch (raw, 1 Gbit/s) one configuration up to the end of its power test, the router's
# timeline every 2 s from the load test's end; $1 config, $2 tag
BIN=${BIN:-target/release/farcache}; cfg=$1; prof=${PROF:-raw}
D=${OUT:-/tmp/tpch-timeline}/$2; mkdir -p $D
$BIN bench paper --profile $prof --experiment tpch --configs $cfg --out $D > $D/log 2>&1 &
bp=$!
until grep -q "\[tpch $cfg\] load test:" $D/log 2>/dev/null; do sleep 0.2; kill -0 $bp || exit 1; done
mp=$(pgrep -f "farcache[-a-z0-9]* mount" | head -1)
mnt=$(tr '\0' '\n' < /proc/$mp/cmdline | grep '^/' | sed -n 3p)
$BIN stats "$mnt" --json > $D/stats-before.json 2>&1
while ! grep -q "\[tpch $cfg\] power test:" $D/log; do
  kill -0 $bp || break
  [ "$cfg" = farcache ] && $BIN stats "$mnt" --json 2>/dev/null | python3 -c "
import json,sys,time
d=json.load(sys.stdin); a=d['routing'].get('adaptive',{}); e=d['engine']; r=d['remote']
print(time.strftime('%T'), 'ad',e.get('adaptive_disk',0),'ar',e.get('adaptive_remote',0),'dr',e.get('disk_reads',0),'rr',e.get('remote_reads',0),'fills',e.get('fills',0),'ra',e.get('read_arounds',0),'share',round(a.get('disk_share'),3),'win',round(a.get('disk_window_mean_us',0)),'hit',round(a.get('remote_hit_us',0)),'d/r',round(a.get('disk_over_remote',0),2),'q',a.get('probe_backoff'),'surv',round(a.get('fills_surviving',0),2))" 2>/dev/null >> $D/tl
  sleep 2
done
$BIN stats "$mnt" --json > $D/stats-after.json 2>&1
kill -TERM $bp; wait $bp
grep "\[tpch $cfg\] \(load test\|power test\)" $D/log
