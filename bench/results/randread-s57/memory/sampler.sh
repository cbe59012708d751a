#!/bin/bash
# sample mount daemons' memory every 2 s until killed
while :; do
  for p in $(pgrep -f "farcache-s57[a-z] mount"); do
    kind=far; grep -q -- "--no-remote" /proc/$p/cmdline 2>/dev/null && kind=pass
    tr '\0' ' ' < /proc/$p/cmdline | grep -q -- "--no-remote" && kind=pass
    echo "$(date +%T) $p $kind $(grep -E '^(Rss|Anonymous|LazyFree|AnonHugePages):' /proc/$p/smaps_rollup 2>/dev/null | awk '{printf "%s%s ", $1, $2}')"
  done
  sleep 2
done
