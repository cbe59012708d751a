#!/bin/bash
# usage: pairs.sh OUTDIR N LABEL=BIN[:ENV] ...   interleaves labels, alternating order per round
out=$1; n=$2; shift 2
for r in $(seq 1 $n); do
  for spec in "$@"; do
    label=${spec%%=*}; rest=${spec#*=}; bin=${rest%%:*}; envs=""; [ "$rest" != "$bin" ] && envs=${rest#*:}
    if [ $((r % 2)) = 1 ]; then cfgs=passthrough,farcache; else cfgs=farcache,passthrough; fi
    d=$out/$label/B$r; [ -f $d/paper-raw.json ] && continue; mkdir -p $d
    $bin bench paper --cleanup >/dev/null
    env $envs $bin bench paper --profile raw --experiment randread --sizes 256MiB --configs $cfgs --out $d > $d/log 2>&1
  done
done
