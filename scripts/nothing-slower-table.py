#!/usr/bin/env python3
"""Issue 17's "Nothing gets slower" table from the results of scripts/bench-nothing-slower.sh.

Reads DIR/<profile>-<experiment>/paper-<profile>.json (default DIR: bench/results/nothing-slower)
and prints one markdown table: every workload the runs hold (rows) by disk profile (columns),
as farcache ÷ passthrough performance ratios from the same `bench paper` invocation (> 1:
farcache faster), each marked against its target. Exits 1 when no result is found.

    scripts/nothing-slower-table.py [DIR]
"""
import glob
import json
import os
import re
import sys

PROFILES = ["raw", "cloud", "hdd"]


def human(n):
    return f"{n >> 30}GiB" if n >= 1 << 30 else f"{n >> 20}MiB"


def ratios(doc):
    """(workload, ratio, target) rows of one result document."""
    out = []
    runs = {}
    for r in doc.get("runs", []):
        if r.get("error") or not r.get("passes"):
            continue
        runs[(r["experiment"], r["size_bytes"], r["config"])] = r
    for (exp, size, cfg), fc in sorted(runs.items()):
        if cfg != "farcache" or (exp, size, "passthrough") not in runs:
            continue
        pt = runs[(exp, size, "passthrough")]
        for p_fc, p_pt in zip(fc["passes"], pt["passes"]):
            n = p_fc["pass"]
            out.append((f"{exp} {human(size)} pass {n}", p_pt["secs"] / p_fc["secs"], 0.97))
        if exp == "randread" and len(fc["passes"]) > 1:
            p = fc["passes"][1]
            hit = p.get("hit_ratio_page_cache", 0) + p.get("hit_ratio_remote", 0)
            # The target applies where the routing used the lenders (its probe reads went to
            # them); a rule that kept the reads on a disk as fast as a lender hit is right to.
            probe = fc.get("probe") or {}
            on_lenders = probe.get("lender_hits", 0) * 2 >= probe.get("measured", {}).get("reads", 0)
            out.append((f"randread {human(size)} pass 2 hit ratio (page cache + lenders)", hit, None if on_lenders else "n/a"))
    pg = {}
    for r in doc.get("pgbench") or []:
        if not r.get("error") and r.get("tps"):
            pg[(r["mode"], r["clients"], r["config"])] = r["tps"]
    for (mode, clients, cfg), tps in sorted(pg.items()):
        if cfg == "farcache" and (mode, clients, "passthrough") in pg:
            target = 1.0 if mode == "tpc-b" and clients >= 4 else 0.97
            out.append((f"pgbench {mode} {clients} clients", tps / pg[(mode, clients, "passthrough")], target))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "bench/results/nothing-slower"
    table = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "paper-*.json"))):
        doc = json.load(open(path))
        prof = doc.get("options", {}).get("profile", "?")
        for name, ratio, target in ratios(doc):
            table.setdefault(name, {})[prof] = (ratio, target)
    if not table:
        print(f"no results under {root}", file=sys.stderr)
        return 1
    profs = [p for p in PROFILES if any(p in row for row in table.values())]
    print("| workload | " + " | ".join(profs) + " |")
    print("|---|" + "---:|" * len(profs))
    def order(name):
        # By experiment, then sizes and client counts as numbers (256MiB before 1GiB; 1, 4, 16).
        def key(w):
            m = re.fullmatch(r"(\d+)(MiB|GiB)?", w)
            return (0, int(m[1]) << (10 if m[2] == "GiB" else 0)) if m else (1, w)
        return [key(w) for w in name.split()]

    for name in sorted(table, key=order):
        cells = []
        for p in profs:
            if p not in table[name]:
                cells.append("–")
                continue
            ratio, target = table[name][p]
            if target == "n/a":
                cells.append(f"{ratio:.1%} (n/a: reads kept on the disk)")
            elif target is None:
                cells.append(f"{ratio:.1%}" if ratio >= 0.99 else f"**{ratio:.1%}**")
            else:
                cells.append(f"{ratio:.2f}" if ratio >= target else f"**{ratio:.2f}**")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nfarcache ÷ passthrough (performance: > 1 is farcache faster), one `bench paper` invocation")
    print("per profile and experiment; **bold**: below its target (0.97; TPC-B at 4 and 16 clients")
    print("1.0; hit ratio 99%, which applies only where the lenders are faster than the disk).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
