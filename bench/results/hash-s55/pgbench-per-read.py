#!/usr/bin/env python3
"""Per transaction and per FUSE read, for each pair of a nothing-slower pgbench job: FUSE reads,
the mount's FUSE workers' CPU, PostgreSQL's and pgbench's (the client cgroup's) CPU, and the
harness's CPU and disk checks. Usage: pgbench-per-read.py JOB_DIR [CLIENTS] (e.g.
bench/results/nothing-slower-s54/raw-pgbench 1)."""
import glob
import json
import sys

job, clients = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
print("| pair | mode | config | tps | FUSE reads a tx | FUSE workers µs a read | client µs a tx | CPU check µs | disk check µs |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for f in sorted(glob.glob(f"{job}/rep*/paper-*.json")):
    for p in json.load(open(f))["pgbench"]:
        if p["clients"] != clients or p.get("error"):
            continue
        t, reads = p["transactions"], p["fuse_ops"].get("read", 0)
        fuser_us = p["daemon_threads_ms"].get("fuser-", 0) * 1e3
        d = p["disk"]
        print(f"| {f.split('/')[-2]} | {p['mode']} | {p['config']} | {p['tps']:.0f} | {reads / t:.3f} "
              f"| {fuser_us / max(reads, 1):.1f} | {p['cpu']['client_ms'] * 1e3 / t:.0f} "
              f"| {d['cpu_check_before_us']:.0f}/{d['cpu_check_after_us']:.0f} "
              f"| {d['check_before_us']:.0f}/{d['check_after_us']:.0f} |")
