#!/usr/bin/env python3
"""Per-NewOrder figures of `farcache bench paper --experiment oltp` results, as markdown rows:
tpmC and its ratio to native at the same connection count, client CPU, daemon CPU and disk
reads per NewOrder (with the ratio to native), and the mount's FUSE requests per NewOrder
(`fuse_ops` of each point's record: the total and the four largest opcodes).

    scripts/bench-oltp-per-neworder.py RESULT.json [RESULT.json ...]
"""
import json
import sys


def rows(path):
    recs = json.load(open(path))["oltp"]
    native = {(r["kind"], r["connections"]): r for r in recs if r["config"] == "native"}
    for r in recs:
        n = native.get((r["kind"], r["connections"]))
        if n is None or r.get("error"):
            continue
        no, nno = max(r["new_orders"], 1), max(n["new_orders"], 1)
        cpu, ncpu = r["cpu"]["client_ms"] / no, n["cpu"]["client_ms"] / nno
        rd, nrd = r["disk"]["read_ios"] / no, max(n["disk"]["read_ios"] / nno, 1e-9)
        ops = r.get("fuse_ops") or {}
        top = ", ".join(f"{k} {v / no:.1f}" for k, v in sorted(ops.items(), key=lambda x: -x[1])[:4])
        total = f"{sum(ops.values()) / no:.0f}" if ops else "–"
        yield (
            f"| {r['config']} | {r['connections']} | {r['tpmc']:,.0f} | {r['tpmc'] / max(n['tpmc'], 1e-9):.2f} | "
            f"{cpu:.1f} ({cpu / ncpu:.2f}×) | {r['cpu']['daemon_ms'] / no:.1f} | {rd:.1f} ({rd / nrd:.2f}×) | "
            f"{total} | {top} |"
        )


if __name__ == "__main__":
    print("| config | conn | tpmC | ÷ native | client CPU ms | daemon CPU ms | disk reads | FUSE requests | largest |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for p in sys.argv[1:]:
        for row in rows(p):
            print(row)
