#!/bin/bash
# Every 4 s: which build's mount daemon runs, passthrough or farcache, its RssAnon (KiB) and memory stats.
while :; do
  for s in /var/tmp/farcache-bench/fcb-*/mnt; do
    [ -d "$s/pg" ] || continue
    p=$(pgrep -f "farcache-s53[a-z]* mount" | head -1); [ -n "$p" ] || continue
    b=$(tr '\0' ' ' </proc/$p/cmdline | awk '{print $1}'); m=$(grep -q -- "--no-remote" /proc/$p/cmdline 2>/dev/null && echo pass || echo farc)
    echo "$(date +%T) $(basename $b) $m $(awk '/RssAnon/{print $2}' /proc/$p/status) $($b stats $s --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps(d.get("memory")))')"
  done
  sleep 4
done
