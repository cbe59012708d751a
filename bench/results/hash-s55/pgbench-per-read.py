#!/usr/bin/env python3
"""Per transaction and per FUSE read, for each `bench paper` pgbench JSON under DIR (at any
depth: a nothing-slower job's rep*/, or idle-lender.sh's r*/{default,idle}/): FUSE reads, the
mount's FUSE workers' CPU, PostgreSQL's and pgbench's (the client cgroup's) CPU, and the
harness's CPU and disk checks, then the median of each configuration. Usage:
pgbench-per-read.py DIR [CLIENTS] (e.g. bench/results/nothing-slower-s54/raw-pgbench 1)."""
import glob
import json
import os
import statistics
import sys

job, clients = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
print("| pair | mode | config | tps | FUSE reads a tx | FUSE workers µs a read | client µs a tx | CPU check µs | disk check µs |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
cells = {}
for f in sorted(glob.glob(f"{job}/**/paper-*.json", recursive=True)):
    label = os.path.relpath(os.path.dirname(f), job)
    for p in json.load(open(f)).get("pgbench") or []:
        if p["clients"] != clients or p.get("error"):
            continue
        t, reads = p["transactions"], p["fuse_ops"].get("read", 0)
        fuser_us = p["daemon_threads_ms"].get("fuser-", 0) * 1e3
        d = p["disk"]
        config = p["config"] + (" (idle lender)" if label.endswith("idle") else "")
        cells.setdefault((p["mode"], config), []).append(
            (p["tps"], fuser_us / max(reads, 1), p["cpu"]["client_ms"] * 1e3 / t))
        print(f"| {label} | {p['mode']} | {config} | {p['tps']:.0f} | {reads / t:.3f} "
              f"| {fuser_us / max(reads, 1):.1f} | {p['cpu']['client_ms'] * 1e3 / t:.0f} "
              f"| {d['cpu_check_before_us']:.0f}/{d['cpu_check_after_us']:.0f} "
              f"| {d['check_before_us']:.0f}/{d['check_after_us']:.0f} |")

print()
print("| mode | config | runs | tps (median) | FUSE workers µs a read | client µs a tx |")
print("|---|---|---:|---:|---:|---:|")
for (mode, config), rows in sorted(cells.items()):
    med = [statistics.median(r[i] for r in rows) for i in range(3)]
    print(f"| {mode} | {config} | {len(rows)} | {med[0]:.0f} | {med[1]:.1f} | {med[2]:.0f} |")
