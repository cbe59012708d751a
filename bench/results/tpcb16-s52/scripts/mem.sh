#!/bin/bash
while :; do
  for s in /var/tmp/farcache-bench/fcb-*/mnt; do
    [ -d "$s/pg" ] || continue
    p=$(pgrep -f "farcache-main mount" | head -1); m=$(grep -q -- "--no-remote" /proc/$p/cmdline 2>/dev/null && echo pass || echo farc)
    echo "$(date +%T) $m $(awk '/RssAnon/{print $2}' /proc/$p/status) $(/tmp/farcache-main stats $s --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps(d.get("memory")), d.get("cache",{}).get("remote",{}).get("puts_in_flight") if isinstance(d.get("cache"),dict) else "")')"
  done
  sleep 4
done
