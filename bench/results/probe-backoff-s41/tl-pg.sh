#!/bin/bash
# raw pgbench at $CLIENTS clients, passthrough then farcache, with a 1 s timeline of farcache's router; $1 tag
BIN=${BIN:-/tmp/farcache-pin}; D=${OUT:-/tmp/s41/pg}/$1; mkdir -p $D
$BIN bench paper --profile ${PROF:-raw} --experiment pgbench --pgbench-clients ${CLIENTS:-16} --configs ${CONFIGS:-passthrough,farcache} --out $D > $D/log 2>&1 & bp=$!
mp=""
while kill -0 $bp 2>/dev/null; do
  if [ -z "$mp" ] || ! kill -0 $mp 2>/dev/null; then
    mp=$(pgrep -f "farcache[-a-z0-9]* mount" | head -1)
    [ -n "$mp" ] && mnt=$(tr '\0' '\n' < /proc/$mp/cmdline | grep '^/' | sed -n 3p)
  fi
  if [ -n "$mp" ]; then
    $BIN stats "$mnt" --json 2>/dev/null | python3 -c "
import json,sys,time
d=json.load(sys.stdin); a=d['routing'].get('adaptive',{}); e=d['engine']; r=d['remote']
print(time.strftime('%T'), 'ad',e.get('adaptive_disk',0),'ar',e.get('adaptive_remote',0),'dr',e.get('disk_reads',0),'rr',e.get('remote_reads',0),'fills',e.get('fills',0),'ra',e.get('read_arounds',0),'probes',e.get('adaptive_probes',0),'share',a.get('disk_share'),'win',round(a.get('disk_window_mean_us',0)),'hit',round(a.get('remote_hit_us',0)),'d/r',round(a.get('disk_over_remote',0),2),'q',a.get('probe_backoff'),'fail',r.get('fallbacks',0))" 2>/dev/null
  fi
  sleep 1
done > $D/tl
grep "tps" $D/log | cut -c1-200
