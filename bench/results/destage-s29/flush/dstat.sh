#!/bin/bash
# sample vda every 0.5 s while $1 (a pid) lives: r/s rMB/s wMB/s avg-queue
prev=($(awk '$3=="vda"{print $4,$6,$8,$10,$14}' /proc/diskstats))
while kill -0 $1 2>/dev/null; do sleep 0.5
cur=($(awk '$3=="vda"{print $4,$6,$8,$10,$14}' /proc/diskstats))
echo "r/s $(( (cur[0]-prev[0])*2 )) rMB/s $(( (cur[1]-prev[1])*512*2/1000000 )) w/s $(( (cur[2]-prev[2])*2 )) wMB/s $(( (cur[3]-prev[3])*512*2/1000000 )) q $(echo "scale=1;(${cur[4]}-${prev[4]})/500" | bc)"
prev=("${cur[@]}"); done
