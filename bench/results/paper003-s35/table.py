#!/usr/bin/env python3
"""The tables of durable-cpu/cpu.json and postmark-fuse-5k/pm.json (each round's figures, a / b)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def rounds(rows, key, fmt):
    return " / ".join(fmt(r[key]) for r in rows)


d = json.load(open(f"{HERE}/durable-cpu/cpu.json"))
print("| writers | configuration | writes/s | machine CPU µs per write | daemon CPU µs per write | "
      "context switches per write | CPUs busy of 2 | writes per flush of the tier |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for w in (1, 32):
    for c in ("native", "passthrough", "tier-dram", "tier-ssd"):
        rs = [r for r in d["rows"] if r["writers"] == w and r["config"] == c]
        per_flush = " / ".join(f"{r['tier']['writes'] / r['tier']['flushes']:.1f}" if r["tier"].get("flushes") else "–"
                               for r in rs)
        print(f"| {w} | {c} | {rounds(rs, 'writes_per_s', lambda x: f'{x:,.0f}')} | "
              f"{rounds(rs, 'busy_us', lambda x: f'{x:.0f}')} | {rounds(rs, 'daemon_us', lambda x: f'{x:.0f}')} | "
              f"{rounds(rs, 'ctxt_per_write', lambda x: f'{x:.1f}')} | {rounds(rs, 'busy_cpus', lambda x: f'{x:.2f}')} | "
              f"{per_flush} |")
print()
p = json.load(open(f"{HERE}/postmark-fuse-5k/pm.json"))
print("| configuration | transactions/s | FUSE requests per transaction | wall µs per request | "
      "daemon CPU µs per request | CPUs busy of 2 |")
print("|---|---:|---:|---:|---:|---:|")
for c in ("native", "passthrough", "tier-dram"):
    rs = [r for r in p["rows"] if r["config"] == c]
    f = lambda k, fm: rounds(rs, k, fm) if k in rs[0] else "–"
    print(f"| {c} | {f('tx_per_s', lambda x: f'{x:,.0f}')} | {f('requests_per_tx', lambda x: f'{x:.1f}')} | "
          f"{f('wall_us_per_request', lambda x: f'{x:.0f}')} | {f('daemon_us_per_request', lambda x: f'{x:.0f}')} | "
          f"{f('busy_cpus', lambda x: f'{x:.2f}')} |")
