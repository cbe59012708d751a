#!/bin/bash
cd /work/main
D=$1; shift
BIN=${BIN:-/tmp/farcache-s43} scripts/router-timeline.sh $D "$@" &
until grep -q "power test:" $D/log 2>/dev/null; do sleep 1; done
pkill -TERM -f "$(basename ${BIN:-/tmp/farcache-s43}) bench paper"
wait
