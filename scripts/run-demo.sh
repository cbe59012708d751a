#!/usr/bin/env bash
# `make run`: the main job on embedded defaults. Starts a lender with the built-in defaults
# (512 MiB, S3-FIFO; on a free loopback port), checks it end to end with a two-pass random
# read of 256 MiB, shows its counters, and stops it. Leaves nothing running.
set -euo pipefail
BIN=${BIN:-target/release/farcache}
out=$(mktemp)
cleanup() {
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -f "$out"
}
trap cleanup EXIT INT TERM

echo "== starting: $BIN server --listen 127.0.0.1:0 (every other setting: the embedded defaults)"
"$BIN" server --listen 127.0.0.1:0 >"$out" &
pid=$!
for _ in $(seq 100); do
  addr=$(awk '/listening on/ {print $NF}' "$out")
  [ -n "$addr" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "server exited early" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { echo "server did not report its address" >&2; exit 1; }

echo; echo "== exercising: $BIN check --server $addr --size 256MiB"
"$BIN" check --server "$addr" --size 256MiB
echo; echo "== counters: $BIN stats --server $addr"
"$BIN" stats --server "$addr"
echo; echo "== stopping the server (SIGTERM)"
kill -TERM "$pid"; wait "$pid"; pid=
echo "done"
