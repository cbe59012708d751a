#!/usr/bin/env python3
"""Per round of a `scripts/bench-ab.sh` pgbench A/B: each run's tps against the passthrough's,
and the blocks it stored on the lenders (puts) and read from them (hits), for A and B.
Usage: pgbench-puts.py OUT/raw-pgbench"""
import glob, json, os, statistics, sys

def runs(d):
    fs = glob.glob(os.path.join(d, 'paper-*.json'))
    if not fs:
        return None
    return {(x['mode'], x['clients']): x for x in json.load(open(fs[0])).get('pgbench') or [] if x.get('tps')}

root = sys.argv[1]
rounds = sorted({int(os.path.basename(p).split('-')[0]) for p in glob.glob(os.path.join(root, '*-*'))})
ratios = {}
print('| round | run | passthrough tps | A ratio | B ratio | puts A / B | hits A / B |')
print('|---|---|---:|---:|---:|---|---|')
for rd in rounds:
    r = {c: runs(os.path.join(root, f'{rd}-{c}')) for c in ('pass', 'a', 'b')}
    if not all(r.values()):
        continue
    for k in sorted(r['pass']):
        if k not in r['a'] or k not in r['b']:
            continue
        p, a, b = r['pass'][k], r['a'][k], r['b'][k]
        ra, rb = a['tps'] / p['tps'], b['tps'] / p['tps']
        ratios.setdefault(k, ([], []))
        ratios[k][0].append(ra)
        ratios[k][1].append(rb)
        print(f"| {rd} | {k[0]} {k[1]} | {p['tps']:.0f} | {ra:.3f} | {rb:.3f} | "
              f"{a['lenders']['puts']} / {b['lenders']['puts']} | {a['lenders']['hits']} / {b['lenders']['hits']} |")
print()
for k, (ra, rb) in sorted(ratios.items()):
    print(f'{k[0]} {k[1]} clients: median A {statistics.median(ra):.3f} ({min(ra):.3f}-{max(ra):.3f}), '
          f'B {statistics.median(rb):.3f} ({min(rb):.3f}-{max(rb):.3f}) of {len(ra)} rounds')
