#!/usr/bin/env bash
# pgbench (select-only and TPC-B, 1/4/16 clients) on the cloud profile, passthrough and farcache,
# with the mount's readahead window at 1 MiB (a) and 512 KiB (d), one after the other.
# Usage: sudo BIN=... VARIANTS="a d" bench/results/readahead-s33/pgbench.sh
set -u
cd "$(dirname "$0")/../../.."
BIN=${BIN:-target/release/farcache}; VARIANTS=${VARIANTS:-"a d"}
here=bench/results/readahead-s33
for v in $VARIANTS; do
  d=$here/pgbench-$v; mkdir -p "$d"
  ls "$d"/paper-*.json >/dev/null 2>&1 && continue
  echo "== $v $(date +%T)"
  "$BIN" bench paper --profile cloud --experiment pgbench --configs passthrough,farcache --pgbench-secs 20 \
    --mount-config "$here/$v.toml" --out "$d" >"$d/log" 2>&1 || echo "   failed: see $d/log"
done
