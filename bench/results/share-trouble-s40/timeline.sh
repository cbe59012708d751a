#!/bin/bash
# cloud randread 1GiB farcache only, with a 1 s timeline of the router (scripts/router-timeline.sh); $1 tag
BIN=${BIN:-target/release/farcache}; D=${OUT:-/tmp/s40/crr}/$1
BIN=$BIN "$(dirname "$0")/../../../scripts/router-timeline.sh" "$D" --profile ${PROF:-cloud} --experiment randread --sizes ${SIZE:-1GiB} --configs farcache
grep -A8 "seconds per pass" $D/paper-*.md | head -12
