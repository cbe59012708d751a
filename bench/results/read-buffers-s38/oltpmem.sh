#!/bin/bash
# run the quick oltp (farcache only, 128 MiB) with env $@, report peak daemon anon
tag=$1; shift
/tmp/s38/sample.sh /tmp/s38/mem-$tag.txt & s=$!
env "$@" ${BIN:-/tmp/s38/farcache-dbg} bench paper --quick --experiment oltp --profile raw --memory 128MiB --configs farcache --out /tmp/s38/oltp-$tag > /tmp/s38/oltp-$tag.log 2>&1
kill $s
echo "$tag peak_anon_KiB $(awk '{print $3}' /tmp/s38/mem-$tag.txt | sort -n | tail -1) kills $(grep -c 'OOM kill' /tmp/s38/oltp-$tag.log) tpmC $(grep 'paper: \[oltp' /tmp/s38/oltp-$tag.log | sed 's/.*tpmC \([0-9]*\).*/\1/' | tr '\n' ' ') daemonCPU $(grep 'paper: \[oltp' /tmp/s38/oltp-$tag.log | sed 's/.*daemon \([0-9.]*\)).*/\1/' | tr '\n' ' ')"
