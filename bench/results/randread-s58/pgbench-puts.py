#!/usr/bin/env python3
"""Per round of a `scripts/bench-ab.sh` pgbench A/B: each run's tps against the passthrough's,
and the blocks it stored on the lenders (puts) and read from them (hits), for A and B; where the
records carry the mount's routing state (`routing`, recorded since session 58), also how the
lenders' probe back-off ended during each run ([by windows, by probes], the difference from the
run before on the same mount) and the disk's share at its end. Usage: pgbench-puts.py OUT/raw-pgbench"""
import statistics, sys

from backoff import ab_rounds

def runs(doc):
    out, before = {}, [0, 0]
    for x in doc.get('pgbench') or []:
        a = ((x.get('routing') or {}).get('adaptive')) or {}
        ends = a.get('backoff_ends')
        if ends:
            x['ends'] = [ends[0] - before[0], ends[1] - before[1]]
            x['share'] = a.get('disk_share')
            before = ends
        if x.get('tps'):
            out[(x['mode'], x['clients'])] = x
    return out

def routed(x):
    return f"{x['ends']} share {x['share']:.2f}" if 'ends' in x else '-'

root = sys.argv[1]
ratios = {}
print('| round | run | passthrough tps | A ratio | B ratio | puts A / B | hits A / B | back-off ends, disk share: A / B |')
print('|---|---|---:|---:|---:|---|---|---|')
for rd, r in ab_rounds(root, runs):
    for k in sorted(r['pass']):
        if k not in r['a'] or k not in r['b']:
            continue
        p, a, b = r['pass'][k], r['a'][k], r['b'][k]
        ra, rb = a['tps'] / p['tps'], b['tps'] / p['tps']
        ratios.setdefault(k, ([], []))
        ratios[k][0].append(ra)
        ratios[k][1].append(rb)
        print(f"| {rd} | {k[0]} {k[1]} | {p['tps']:.0f} | {ra:.3f} | {rb:.3f} | "
              f"{a['lenders']['puts']} / {b['lenders']['puts']} | {a['lenders']['hits']} / {b['lenders']['hits']} | "
              f"{routed(a)} / {routed(b)} |")
print()
for k, (ra, rb) in sorted(ratios.items()):
    print(f'{k[0]} {k[1]} clients: median A {statistics.median(ra):.3f} ({min(ra):.3f}-{max(ra):.3f}), '
          f'B {statistics.median(rb):.3f} ({min(rb):.3f}-{max(rb):.3f}) of {len(ra)} rounds')
