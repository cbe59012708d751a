#!/usr/bin/env python3
"""The table of a configuration A/B (scripts/bench-config-ab.sh): per disk profile, link,
size and pass, the median over the rounds of each configuration's seconds with mount config
a and with b, and of the ratios passthrough ÷ native and farcache ÷ passthrough (> 1: the
second is faster), each ratio from one round. Rounds named in SKIP (ROUND-PROFILE-LINK, e.g.
2-cloud-10gbit) are left out.

usage: config-ab-table.py OUT [SKIP ...]"""
import collections
import glob
import json
import os
import statistics
import sys


def main():
    out, skip = sys.argv[1], set(sys.argv[2:])
    res = collections.defaultdict(dict)
    for f in sorted(glob.glob(os.path.join(out, "*/paper-*.json"))):
        rnd, prof, link, v = os.path.basename(os.path.dirname(f)).split("-")
        if f"{rnd}-{prof}-{link}" in skip:
            continue
        for r in json.load(open(f))["runs"]:
            for p in r["passes"]:
                res[(prof, link, r["size_bytes"] >> 20, p["pass"])][(rnd, v, r["config"])] = p["secs"]

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def f2(x):
        return "–" if x is None else f"{x:.2f}"

    print("| disk, link | size, pass | rounds | native s, a / b | passthrough s, a / b | farcache s, a / b "
          "| passthrough ÷ native, a / b | farcache ÷ passthrough, a / b |")
    print("|---|---|---:|---|---|---|---|---|")
    for k in sorted(res):
        row = res[k]
        rounds = sorted({x[0] for x in row})
        cols = []
        for c in ["native", "passthrough", "farcache"]:
            a, b = (med([row.get((r, v, c)) for r in rounds]) for v in "ab")
            cols.append("–" if a is None else f"{f2(a)} / {f2(b)}")
        ratios = []
        for num, den in [("native", "passthrough"), ("passthrough", "farcache")]:
            per = [med([row[(r, v, num)] / row[(r, v, den)] for r in rounds
                        if row.get((r, v, num)) and row.get((r, v, den))]) for v in "ab"]
            ratios.append(f"{f2(per[0])} / {f2(per[1])}")
        print(f"| {k[0]}, {k[1]} | {k[2]} MiB, {k[3]} | {len(rounds)} | " + " | ".join(cols + ratios) + " |")


if __name__ == "__main__":
    main()
