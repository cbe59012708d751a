#!/bin/bash
# dfsio (ssd profile), passthrough beside tier-ssd (commit = fsync), before (new2: no write-back start) and after (wb), interleaved
cd /work/main
O=bench/results/paper003-s31/wb
for r in 1-new2 1-wb 2-wb 2-new2; do
  [ -e $O/$r/DONE ] && continue
  mkdir -p $O/$r
  /tmp/s31/farcache-${r#*-} bench paper --profile ssd --experiment dfsio --configs passthrough,tier-ssd --out $O/$r > $O/$r.log 2>&1 && touch $O/$r/DONE
done
echo DONE > $O/DONE
