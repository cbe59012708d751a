#!/usr/bin/env python3
"""Per-query seconds of tpch's power test from the logs of power.sh, one column per run."""
import re, sys, glob, os
here = os.path.dirname(os.path.abspath(__file__))
names = {"a": "1MiB", "b": "128KiB", "c": "256KiB", "d": "512KiB"}
runs = sorted(glob.glob(os.path.join(here, "power*/log")))
cols, data = [], {}
for r in runs:
    d = os.path.basename(os.path.dirname(r))
    m = re.match(r"power(\d*)-(\w+)-(\w+)-(\w)", d)
    rnd, cfg, link, v = m.groups()
    txt = open(r).read()
    t = re.search(r"\] power test: ([\d.]+) s", txt)
    if not t:
        continue
    col = f"{cfg} {link} {names[v]} r{rnd or 1}"
    cols.append(col)
    data[col] = {q: float(s) for q, s in re.findall(r"power\] stream 0 (q\d+): ([\d.]+) s", txt)}
    data[col]["power test"] = float(t.group(1))
    data[col]["load test"] = float(re.search(r"load test: ([\d.]+) s", txt).group(1))
rows = ["load test", "power test"] + sorted({q for c in cols for q in data[c] if q.startswith("q")}, key=lambda q: int(q[1:]))
print("| | " + " | ".join(cols) + " |")
print("|---|" + "---:|" * len(cols))
for row in rows:
    print(f"| {row} | " + " | ".join(f"{data[c].get(row, float('nan')):.1f}" for c in cols) + " |")
