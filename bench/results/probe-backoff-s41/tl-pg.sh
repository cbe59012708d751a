#!/bin/bash
# raw pgbench at $CLIENTS clients, passthrough then farcache, with a 1 s timeline of farcache's router
# (scripts/router-timeline.sh); $1 tag
BIN=${BIN:-/tmp/farcache-pin}; D=${OUT:-/tmp/s41/pg}/$1
BIN=$BIN "$(dirname "$0")/../../../scripts/router-timeline.sh" "$D" --profile ${PROF:-raw} --experiment pgbench --pgbench-clients ${CLIENTS:-16} --configs ${CONFIGS:-passthrough,farcache}
grep "tps" $D/log | cut -c1-200
