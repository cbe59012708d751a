#!/bin/bash
# sample the mount daemon's memory every 0.5 s
out=$1; : > $out
while true; do
  for p in $(pgrep -f "farcache[-a-z0-9]* mount" ); do
    [ -r /proc/$p/status ] || continue
    a=$(awk '/RssAnon/{a=$2}/RssFile/{f=$2}/Threads/{t=$2}END{print a, f, t}' /proc/$p/status)
    echo "$(date +%T.%N | cut -c1-11) $p $a" >> $out
    if [ -n "$a" ] && [ ${a%% *} -gt ${MAXA:-0} ]; then MAXA=${a%% *}; cat /proc/$p/smaps > $out.smaps.$p 2>/dev/null; fi
  done
  sleep 0.5
done
