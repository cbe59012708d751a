#!/bin/bash
# Session 48's sweep of the fill pipeline's bounds (BENCHMARKS.md, "Session 48"). /tmp/farcache-pif
# was a temporary build of ca6cdbb (not committed) whose put requests in flight per lender
# (FC_PIF, PUT_REQUESTS_IN_FLIGHT) and blocks per request (FC_PRB, PUT_REQUEST_BLOCKS) came from
# the environment; the queue's bound is the real setting cache.max_pending_puts.
# name pif prb mpp
run() { d=/tmp/s48/sw-$1; mkdir -p $d; printf '[cache]\nmax_pending_puts = %s\n' $4 > $d/cfg.toml
  FC_PIF=$2 FC_PRB=$3 /tmp/farcache-pif bench paper --profile cloud --experiment seqread --sizes 1GiB --link 10gbit --configs farcache --mount-config $d/cfg.toml --out $d > $d/log 2>&1; }
for r in 1 2; do
run base-$r 2 8 2048
run q8k-$r 2 8 8192
run pif8q8k-$r 8 8 8192
run prb64q8k-$r 2 64 8192
run prb64-$r 2 64 2048
done
touch /tmp/s48/sweep.done
