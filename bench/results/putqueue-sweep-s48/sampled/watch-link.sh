#!/bin/bash
# samples every 0.5 s: tbf drops on host side, /proc/stat, mount pid cpu
while [ ! -e /tmp/s48/watch.stop ]; do
  t=$(date +%s.%N)
  q=$(tc -s qdisc show 2>/dev/null | grep -A2 "qdisc tbf" | grep -o "dropped [0-9]*\|overlimits [0-9]*\|Sent [0-9]* bytes" | tr '\n' ' ')
  c=$(head -1 /proc/stat)
  pids=$(pgrep -f "farcache.*mount" | tr '\n' ',')
  m=""
  for p in $(pgrep -f "farcache(-pif)? (mount|server)|farcache-pif mount|farcache-pif server"); do m="$m $p:$(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null)"; done
  echo "$t | $q | $c | $m"
  sleep 0.5
done
