#!/bin/bash
# Wake-ups of the lender runtime's threads with the waker's stack, 10 s into a TPC-B 16 run.
WAIT_AFTER=10 "$(dirname "$0")/wait-tpcb.sh"
perf record -q -e sched:sched_wakeup --filter 'comm == "farcache-remote"' -a --call-graph dwarf,4096 -o /tmp/prof/wake-farc.data -- sleep 5 >/dev/null 2>&1
echo "recorded $(date +%T)"
