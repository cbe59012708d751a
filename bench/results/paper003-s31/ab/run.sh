#!/bin/bash
# Issue 12, session 31: the ssd tier's commit, "fsync" (new default) against "write" (every write
# flushed, the old behaviour), one binary, interleaved; durable and dfsio on the ssd profile,
# then TPC-B on the cloud profile with the passthrough beside them. Resumable per run.
cd /work/main
B=${B:-/tmp/s31/farcache-new2}
O=bench/results/paper003-s31/ab
run() { # name, args...
  local n=$1; shift
  [ -e "$O/$n/DONE" ] && return
  mkdir -p "$O/$n"
  "$B" bench paper "$@" --out "$O/$n" > "$O/$n.log" 2>&1 && touch "$O/$n/DONE"
}
for r in 1-fsync 1-write 2-write 2-fsync; do
  run durable-$r --profile ssd --experiment durable --configs tier-ssd --durable-secs 10 --tier-commit ${r#*-}
done
for r in 1-fsync 1-write 2-write 2-fsync; do
  run dfsio-$r --profile ssd --experiment dfsio --configs passthrough,tier-ssd --tier-commit ${r#*-}
done
for r in 1-fsync 1-write; do
  run tpcb-$r --profile cloud --experiment pgbench --configs passthrough,tier-ssd --pgbench-secs 20 --tier-commit ${r#*-}
done
echo DONE > $O/DONE
