#!/usr/bin/env python3
"""The condensed tables of BENCHMARKS.md ("Session 34: paper 002's figures from one run") from
bench-engine.sh's JSON: IOPS ÷ native per configuration, and p50 over native's."""
import json
import sys

prof = sys.argv[1] if len(sys.argv) > 1 else "raw"
j = json.load(open(f"bench/results/paper002-s34/{prof}/paper002-{prof}.json"))
runs = {}
for r in j["engine_runs"]:
    runs[(r["experiment"], r["config"], r["rw"], r["jobs"], r["iodepth"])] = r
cfgs = ["passthrough", "farcache", "passthrough-ring", "passthrough-kernel"]
print(f"| rw | jobs × QD | native IOPS (p50 µs) | {' | '.join(cfgs)} | kernel p50 − native | passthrough p50 − native |")
print("|---|---|---:|" + "---:|" * (len(cfgs) + 2))
for rw in ["randread", "randwrite"]:
    for jobs in [1, 4]:
        for qd in [1, 4, 16, 32]:
            n = runs.get(("engine", "native", rw, jobs, qd))
            if not n:
                continue
            cells = []
            for c in cfgs:
                r = runs.get(("engine", c, rw, jobs, qd))
                v = r["iops"] / n["iops"] if r else None
                s = f"{v:.2f}" if v is not None else "–"
                if qd >= 16 and v is not None and round(v, 2) >= 0.90:
                    s = f"**{s}**"
                cells.append(s)
            k = runs[("engine", "passthrough-kernel", rw, jobs, qd)]
            p = runs[("engine", "passthrough", rw, jobs, qd)]
            print(f"| {rw} | {jobs} × {qd} | {n['iops']:,.0f} ({n['p50_us']:.0f}) | {' | '.join(cells)} | "
                  f"{k['p50_us'] - n['p50_us']:+.0f} µs | {p['p50_us'] - n['p50_us']:+.0f} µs |")
print()
print("| processes | native | passthrough | passthrough-kernel | serialized | passthrough ÷ serialized | kernel ÷ serialized |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for jobs in [1, 2, 4, 8, 16]:
    g = {c: runs.get(("serial", c, "randread", jobs, 1)) for c in ["native", "passthrough", "passthrough-kernel", "serialized"]}
    if not all(g.values()):
        continue
    f = lambda r: f"{r['iops']:,.0f} ({r['disk_queue']:.1f})"
    print(f"| {jobs} | {f(g['native'])} | {f(g['passthrough'])} | {f(g['passthrough-kernel'])} | {f(g['serialized'])} | "
          f"{g['passthrough']['iops'] / g['serialized']['iops']:.2f} | {g['passthrough-kernel']['iops'] / g['serialized']['iops']:.2f} |")
