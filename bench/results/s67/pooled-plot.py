#!/usr/bin/env python3
"""Every pair of every raw and cloud speed cell at 1 Gbit/s of the "Nothing gets slower" table
but tpch (one pair a run), pooled over several runs of scripts/bench-nothing-slower.sh, as one
strip per cell (farcache ÷ passthrough, log scale, drawn at the edge beyond 0.5–4): an SVG on
stdout, no plotting library needed.
    bench/results/s67/pooled-plot.py DIR... > pooled-pairs.svg
Filled dots: the runs' pairs; a ring: the newest run's (the last DIR); the bar: the median."""
import importlib.util
import math
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("t", os.path.join(here, "../../../scripts/nothing-slower-table.py"))
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)

roots = sys.argv[1:]
if not roots:
    sys.exit("usage: pooled-plot.py DIR... > out.svg")
cells = {}
for k, root in enumerate(roots):
    for name, cols in t.collect(root).items():
        if "hit ratio" in name or name.startswith("tpch"):
            continue
        for col, rows in cols.items():
            if col not in ("raw", "cloud"):
                continue
            for r in rows:
                if isinstance(r[0], float):
                    cells.setdefault((col, name), []).append((r[0], k == len(roots) - 1))
keys = sorted(cells, key=lambda c: (c[0] != "raw", c[1]))
lo, hi = 0.5, 4.0
W, left, right, row = 900, 330, 20, 18
H = 40 + row * len(keys) + 30
x = lambda v: left + (math.log(min(max(v, lo), hi)) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (W - left - right)
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{left}" y="16" font-size="12">farcache ÷ passthrough per pair (log scale; &gt; 1: farcache faster), {len(roots)} runs pooled</text>']
for v in (0.5, 0.75, 0.97, 1.0, 1.5, 2, 3, 4):
    stroke = "#c00" if v == 0.97 else ("#000" if v == 1.0 else "#ddd")
    out.append(f'<line x1="{x(v):.1f}" y1="28" x2="{x(v):.1f}" y2="{H - 25}" stroke="{stroke}" stroke-width="1"/>')
    out.append(f'<text x="{x(v):.1f}" y="{H - 10}" text-anchor="middle">{v:g}</text>')
for i, key in enumerate(keys):
    y = 40 + i * row
    pts = cells[key]
    vals = sorted(p[0] for p in pts)
    med = vals[(len(vals) - 1) // 2]
    out.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{key[0]} {key[1]} ({len(vals)})</text>')
    for v, newest in pts:
        if newest:
            out.append(f'<circle cx="{x(v):.1f}" cy="{y}" r="4" fill="none" stroke="#d60" stroke-width="1.5"/>')
        else:
            out.append(f'<circle cx="{x(v):.1f}" cy="{y}" r="2.5" fill="#36c" fill-opacity="0.5"/>')
    out.append(f'<line x1="{x(med):.1f}" y1="{y - 7}" x2="{x(med):.1f}" y2="{y + 7}" stroke="#000" stroke-width="2"/>')
out.append("</svg>")
print("\n".join(out))
