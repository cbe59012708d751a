#!/bin/bash
while [ ! -e /tmp/s48/watch.stop ]; do
  mp=$(grep -o "/var/tmp/farcache-bench/[^ ]*/mnt" /proc/mounts | head -1)
  if [ -n "$mp" ]; then
    /tmp/farcache-pif stats --json "$mp" 2>/dev/null | python3 -c 'import json,sys,time
d=json.load(sys.stdin); r=d["remote"]; e=d["engine"]
print("%.2f"%time.time(), "puts",r.get("puts"),"drop",r.get("puts_dropped"),"fail",r.get("puts_failed"),"inflight",r.get("puts_in_flight"),"fills",e.get("fills"),"skip",e.get("fills_pending_skipped"),"dr",e.get("disk_reads"), "reqfail", r.get("put_requests_failed"))' 2>/dev/null
  fi
  sleep 0.2
done
