#!/usr/bin/env bash
# An interleaved A/B of two farcache builds against the passthrough: for each round and each
# disk profile, `bench paper` runs the passthrough, build A and build B one after another, so
# that a disk that drifts within minutes (session 17: 2× on this machine) lands on all three
# alike, and the rounds give a spread. The order turns each round (pass-a-b, a-b-pass,
# b-pass-a): whichever runs first or last in a round is not always the same configuration.
# Resumable per round, profile and configuration (a directory with its JSON is skipped).
# Table: python3 scripts/ab-table.py OUT.
#   A, B     the two builds' farcache binaries (required); the passthrough runs with B's
#   PROFS    disk profiles (default "raw cloud");  EXP experiment (default randread)
#   SIZES    access sizes (default 1GiB);  ROUNDS (default 3);  OUT results directory
#   EXTRA    more `bench paper` arguments for every run, e.g. "--pgbench-clients 16"
set -euo pipefail
cd "$(dirname "$0")/.."
: "${A:?A=path of build A's farcache}" "${B:?B=path of build B's farcache}"
PROFS=${PROFS:-"raw cloud"}
EXP=${EXP:-randread}
SIZES=${SIZES:-1GiB}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench/results/ab}
if [ "$(id -u)" != 0 ]; then
  echo "bench-ab: needs root (loop devices, cgroups, network namespaces)" >&2
  exit 1
fi
case $ROUNDS in '' | *[!0-9]* | 0) echo "bench-ab: ROUNDS must be a positive count, not '$ROUNDS'" >&2; exit 2 ;; esac
"$B" bench paper --cleanup
for round in $(seq 1 "$ROUNDS"); do
  for prof in $PROFS; do
    case $(((round - 1) % 3)) in
      0) order="pass a b" ;;
      1) order="a b pass" ;;
      *) order="b pass a" ;;
    esac
    for cfg in $order; do
      case $cfg in
        pass) bin=$B c=passthrough ;;
        a) bin=$A c=farcache ;;
        b) bin=$B c=farcache ;;
      esac
      d="$OUT/$prof-$EXP/$round-$cfg"
      ls "$d"/paper-*.json >/dev/null 2>&1 && continue
      mkdir -p "$d"
      echo "== round $round, $prof, $cfg ($(date +%T))"
      # shellcheck disable=SC2086
      "$bin" bench paper --profile "$prof" --experiment "$EXP" --sizes "$SIZES" --configs "$c" \
        --out "$d" ${EXTRA:-} >"$d/log" 2>&1 || { echo "   failed: see $d/log"; rm -f "$d"/paper-*.json; }
    done
  done
done
