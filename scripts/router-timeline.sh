#!/bin/bash
# Run `farcache bench paper ARGS...` with its results in OUT, and sample the router of whichever
# farcache mount is live once a second (`farcache stats --json`) into OUT/tl: the engine's read
# counts by route, fills, read-arounds and probes, and the adaptive rule's share, windows, lender
# hit estimate, probe back-off, the share of reads the lenders hold and a lender miss's time.
# Root (as `bench paper`).
#   usage: BIN=path/to/farcache scripts/router-timeline.sh OUT [bench paper arguments]
set -u
BIN=${BIN:-target/release/farcache}
D=${1:?usage: router-timeline.sh OUT [bench paper arguments]}
shift
mkdir -p "$D"
"$BIN" bench paper "$@" --out "$D" >"$D/log" 2>&1 &
bp=$!
mp=""
while kill -0 $bp 2>/dev/null; do
  if [ -z "$mp" ] || ! kill -0 "$mp" 2>/dev/null; then
    mp=$(pgrep -f "farcache[-a-z0-9]* mount" | head -1)
    [ -n "$mp" ] && mnt=$(tr '\0' '\n' <"/proc/$mp/cmdline" | grep '^/' | sed -n 3p)
  fi
  if [ -n "$mp" ]; then
    "$BIN" stats "$mnt" --json 2>/dev/null | python3 -c "
import json, sys, time
d = json.load(sys.stdin); a = d['routing'].get('adaptive', {}); e = d['engine']; r = d['remote']
print(time.strftime('%T'), 'ad', e.get('adaptive_disk', 0), 'ar', e.get('adaptive_remote', 0), 'dr', e.get('disk_reads', 0),
      'rr', e.get('remote_reads', 0), 'fills', e.get('fills', 0), 'ra', e.get('read_arounds', 0), 'probes', e.get('adaptive_probes', 0),
      'share', a.get('disk_share'), 'win', round(a.get('disk_window_mean_us', 0)), 'hit', round(a.get('remote_hit_us', 0)),
      'd/r', round(a.get('disk_over_remote', 0), 2), 'q', a.get('probe_backoff'),
      'held', round(a.get('lenders_held', 1), 2), 'miss', round(a.get('lender_miss_us', 0)), 'fail', r.get('fallbacks', 0), 'to', r.get('timeouts', 0))" 2>/dev/null
  fi
  sleep 1
done >"$D/tl"
wait $bp
