#!/bin/bash
# Run `farcache bench paper ARGS...` with its results in OUT, every farcache mount's counters
# recorded each second (`--watch-stats 1s`: OUT/stats/<run>.stats.jsonl), and print them as a
# timeline into OUT/tl (scripts/stats-series.py): per interval the engine's reads by route,
# fills, read-arounds and probes, and the adaptive rule's share, disk window, lender hit
# estimate, the share of reads the lenders hold, a lender miss's time and the probe back-off.
# Root (as `bench paper`).
#   usage: BIN=path/to/farcache scripts/router-timeline.sh OUT [bench paper arguments]
set -u
BIN=${BIN:-target/release/farcache}
D=${1:?usage: router-timeline.sh OUT [bench paper arguments]}
shift
mkdir -p "$D"
"$BIN" bench paper "$@" --watch-stats 1s --out "$D" >"$D/log" 2>&1
rc=$?
python3 "$(dirname "$0")/stats-series.py" "$D"/stats/*.stats.jsonl >"$D/tl"
exit $rc
