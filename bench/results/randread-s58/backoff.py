#!/usr/bin/env python3
"""Per round of a `scripts/bench-ab.sh` randread A/B: each pass's time against the passthrough's,
the blocks the pass stored on the lenders (puts) and the lender hits, and how the back-off of the
lenders' probes ended over the run (`backoff_ends`, [by windows, by probes]). Usage:
backoff.py OUT/raw-randread"""
import glob, json, os, statistics, sys

def paper_json(d):
    """The `bench paper` JSON in directory `d` (None: not there yet)."""
    fs = glob.glob(os.path.join(d, 'paper-*.json'))
    return json.load(open(fs[0])) if fs else None

def ab_rounds(root, load):
    """(round, {'pass', 'a', 'b': load(that configuration's JSON)}) for each complete round of a
    `scripts/bench-ab.sh` experiment directory."""
    rounds = sorted({int(os.path.basename(p).split('-')[0]) for p in glob.glob(os.path.join(root, '*-*'))})
    for rd in rounds:
        docs = {c: paper_json(os.path.join(root, f'{rd}-{c}')) for c in ('pass', 'a', 'b')}
        r = {c: load(d) for c, d in docs.items() if d}
        if len(r) == 3 and all(r.values()):
            yield rd, r

def run(doc):
    runs = doc['runs']
    return runs[0] if runs else None

def main(root):
    ratios = {('a', 1): [], ('a', 2): [], ('b', 1): [], ('b', 2): []}
    ends = {'a': [], 'b': []}
    print('| round | pass | passthrough s | A s | B s | A ratio | B ratio | puts A / B | hits A / B |')
    print('|---|---:|---:|---:|---:|---:|---:|---|---|')
    for rd, r in ab_rounds(root, run):
        for i in (0, 1):
            p = {c: r[c]['passes'][i] for c in r}
            ra = p['pass']['secs'] / p['a']['secs']
            rb = p['pass']['secs'] / p['b']['secs']
            ratios[('a', i + 1)].append(ra)
            ratios[('b', i + 1)].append(rb)
            print(f"| {rd} | {i + 1} | {p['pass']['secs']:.2f} | {p['a']['secs']:.2f} | {p['b']['secs']:.2f} | "
                  f"{ra:.3f} | {rb:.3f} | {p['a']['lenders']['puts']} / {p['b']['lenders']['puts']} | "
                  f"{p['a']['lenders']['hits']} / {p['b']['lenders']['hits']} |")
        for c in ('a', 'b'):
            ends[c].append(r[c]['mount_stats']['routing']['adaptive']['backoff_ends'])
    print()
    for c in ('a', 'b'):
        for n in (1, 2):
            v = ratios[(c, n)]
            if v:
                print(f'{c.upper()} pass {n}: median ratio {statistics.median(v):.3f} of {len(v)} rounds '
                      f'(range {min(v):.3f}-{max(v):.3f})')
        print(f'{c.upper()} backoff_ends [by windows, by probes] per round: {ends[c]}')

if __name__ == '__main__':
    main(sys.argv[1])
