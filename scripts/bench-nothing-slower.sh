#!/usr/bin/env bash
# Issue 17's "Nothing gets slower" set: farcache (default settings) against the passthrough,
# side by side in one `farcache bench paper` invocation per disk profile and experiment, on
# the cloud and raw profiles. Resumable: a profile/experiment whose JSON exists is skipped
# (delete it to run it again). Results: bench/results/nothing-slower/<profile>-<experiment>/.
#   SIZES      access sizes for seqread/randread       (default 256MiB,1GiB)
#   PROFILES   disk profiles                           (default "cloud raw")
#   EXPERIMENTS                                        (default "randread seqread pgbench")
#   EXTRA      extra `bench paper` arguments, e.g. "--routing adaptive"
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/farcache}
OUT=${OUT:-bench/results/nothing-slower}
SIZES=${SIZES:-256MiB,1GiB}
if [ "$(id -u)" != 0 ]; then
  echo "bench-nothing-slower: needs root (loop devices, cgroups, network namespaces)" >&2
  exit 1
fi
"$BIN" bench paper --cleanup
for prof in ${PROFILES:-cloud raw}; do
  for exp in ${EXPERIMENTS:-randread seqread pgbench}; do
    dir="$OUT/$prof-$exp"
    if ls "$dir"/paper-*.json >/dev/null 2>&1; then
      echo "== $prof $exp: done before ($dir), skipped"
      continue
    fi
    mkdir -p "$dir"
    echo "== $prof $exp"
    # shellcheck disable=SC2086
    "$BIN" bench paper --profile "$prof" --experiment "$exp" --sizes "$SIZES" \
      --configs passthrough,farcache --out "$dir" ${EXTRA:-} >"$dir/log" 2>&1 ||
      { echo "   failed: see $dir/log"; rm -f "$dir"/paper-*.json; }
  done
done
