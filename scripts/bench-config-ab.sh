#!/usr/bin/env bash
# An interleaved A/B of two mount configurations with one build: for each round and each job
# (profile:link), `bench paper` runs every configuration (native, passthrough, farcache) with
# mount config A, then again with B, so a disk that drifts within minutes lands on both alike
# and the rounds give a spread. For a setting that changes the passthrough too (it is the same
# daemon): scripts/bench-ab.sh compares two builds' farcache against one passthrough instead.
# Resumable per round, job and variant (a directory with its JSON is skipped).
# Table: python3 scripts/config-ab-table.py OUT.
#   A_CONFIG, B_CONFIG  the two `--mount-config` files (required)
#   BIN      farcache binary (default target/release/farcache)
#   JOBS     profile:link pairs (default "raw:1gbit cloud:1gbit cloud:10gbit"; at 10gbit the
#            native configuration is left out: it sends nothing over the link)
#   EXP      experiment (default seqread);  SIZES (default 256MiB,1GiB);  ROUNDS (default 3)
#   OUT      results directory (default bench/results/config-ab)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${A_CONFIG:?A_CONFIG=mount config file of variant a}" "${B_CONFIG:?B_CONFIG=mount config file of variant b}"
BIN=${BIN:-target/release/farcache}
JOBS=${JOBS:-"raw:1gbit cloud:1gbit cloud:10gbit"}
EXP=${EXP:-seqread}
SIZES=${SIZES:-256MiB,1GiB}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench/results/config-ab}
if [ "$(id -u)" != 0 ]; then
  echo "bench-config-ab: needs root (loop devices, cgroups, network namespaces)" >&2
  exit 1
fi
case $ROUNDS in '' | *[!0-9]* | 0) echo "bench-config-ab: ROUNDS must be a positive count, not '$ROUNDS'" >&2; exit 2 ;; esac
for f in "$A_CONFIG" "$B_CONFIG"; do [ -r "$f" ] || { echo "bench-config-ab: cannot read $f" >&2; exit 2; }; done
"$BIN" bench paper --cleanup
for round in $(seq 1 "$ROUNDS"); do
  for job in $JOBS; do
    prof=${job%%:*} link=${job##*:}
    cfgs=native,passthrough,farcache
    [ "$link" = 10gbit ] && cfgs=passthrough,farcache
    for v in a b; do
      if [ $v = a ]; then mc=$A_CONFIG; else mc=$B_CONFIG; fi
      d="$OUT/$round-$prof-$link-$v"
      ls "$d"/paper-*.json >/dev/null 2>&1 && continue
      mkdir -p "$d"
      echo "== round $round, $prof, $link, $v ($(date +%T))"
      "$BIN" bench paper --profile "$prof" --link "$link" --experiment "$EXP" --sizes "$SIZES" --configs "$cfgs" \
        --mount-config "$mc" --out "$d" >"$d/log" 2>&1 || { echo "   failed: see $d/log"; rm -f "$d"/paper-*.json; }
    done
  done
done
