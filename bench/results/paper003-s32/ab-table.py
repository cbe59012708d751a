#!/usr/bin/env python3
"""dfsio A/B: per variant, each case's tier ÷ passthrough ratio in every round, and the median.
usage: ab-table.py DIR (rounds in DIR/<round>-<variant>/paper003-ssd.json)"""
import json, sys, os, statistics, collections
d = sys.argv[1]
rat = collections.defaultdict(list)   # (variant, config, case) -> [ratio per round]
for r in sorted(os.listdir(d)):
    p = os.path.join(d, r, 'paper003-ssd.json')
    if not os.path.exists(p):
        continue
    var = r.split('-', 1)[1]
    runs = json.load(open(p))['tier_runs']
    base = {x['case']: x['per_sec'] for x in runs if x['config'] == 'passthrough' and x['per_sec']}
    for x in runs:
        if x['config'] != 'passthrough' and x['per_sec'] and x['case'] in base:
            rat[(var, x['config'], x['case'])].append(x['per_sec'] / base[x['case']])
print('| variant | config | case | tier ÷ passthrough, each round | median |')
print('|---|---|---|---|---:|')
for (var, cfg, case), v in sorted(rat.items()):
    print(f"| {var} | {cfg} | {case} | {' / '.join(f'{x:.2f}' for x in v)} | {statistics.median(v):.2f} |")
