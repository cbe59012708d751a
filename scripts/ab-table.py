#!/usr/bin/env python3
"""The table of an interleaved A/B (scripts/bench-ab.sh): per profile and experiment, each
round's results for the passthrough, build A and build B, the ratios against the passthrough
from the same round (> 1: farcache is faster), and their medians over the rounds.
randread/seqread: seconds per pass, ratio = passthrough's time ÷ farcache's; pgbench: tps
per mode and clients, ratio = farcache's ÷ the passthrough's; tpch: the load and power tests'
seconds (ratio as for passes) and the throughput test's queries per hour (as for tps). The
disk checks (4 KiB O_DIRECT reads of the loop device, µs, at the start of each measurement)
show the disk under each, and beside each, the share of the machine's CPU time the
hypervisor stole (steal) during it. randread/seqread passes recorded since session 54 also
give the mount daemon's CPU time in each pass (`daemon CPU ms` rows, ratio = farcache's ÷
the passthrough's: > 1 is farcache costing more).

usage: ab-table.py OUT"""
import glob
import json
import os
import statistics
import sys

CFGS = {"pass": "pass", "a": "a", "b": "b", "old": "a", "new": "b"}


def load(pdir):
    rounds = {}
    for f in glob.glob(os.path.join(pdir, "*-*/paper-*.json")):
        rnd, cfg = os.path.basename(os.path.dirname(f)).split("-", 1)
        if cfg not in CFGS:
            continue
        d = json.load(open(f))
        cells, checks = {}, []
        for run in d.get("runs", []):
            for p in run["passes"]:
                cells[f"{run['size_bytes'] >> 20} MiB pass {p['pass']}"] = ("time", p["secs"])
                if p.get("daemon_cpu_ms") is not None:
                    cells[f"{run['size_bytes'] >> 20} MiB pass {p['pass']} daemon CPU ms"] = ("cpu", p["daemon_cpu_ms"])
                checks.append(p.get("disk") or {})
        for r in d.get("pgbench") or []:
            cells[f"{r['mode']} {r['clients']}"] = ("tps", r["tps"])
            checks.append(r.get("disk") or {})
        for r in d.get("tpch") or []:
            if r.get("error"):
                continue
            cells["tpch load test"] = ("time", r["load_secs"])
            cells["tpch power test"] = ("time", r["power_secs"])
            cells["tpch throughput test (queries per hour)"] = ("tps", r["queries_per_hour"])
            checks += [(r.get(p) or {}).get("disk") or {} for p in ("load", "power_phase", "throughput_phase")]
        rounds.setdefault(int(rnd), {})[CFGS[cfg]] = (cells, checks)
    return rounds


def check(disk):
    """A measurement's disk check at its start, µs, and the share of the machine's CPU time
    the hypervisor stole during it."""
    us = disk.get("check_before_us")
    s = f"{us:.0f}" if us else "–"
    if disk.get("cpu_ticks"):
        s += f" ({100 * disk['steal_ticks'] / disk['cpu_ticks']:.0f}%)"
    return s


def main():
    root = sys.argv[1]
    for pdir in sorted(glob.glob(os.path.join(root, "*"))):
        rounds = load(pdir) if os.path.isdir(pdir) else {}
        full = {k: v for k, v in rounds.items() if all(c in v for c in ("pass", "a", "b"))}
        if not full:
            continue
        print(f"\n### {os.path.basename(pdir)}\n")
        print("| round | cell | passthrough | A | B | A ratio | B ratio |")
        print("|---|---|---:|---:|---:|---:|---:|")
        ratios = {}
        for rnd in sorted(full):
            r = full[rnd]
            for cell, (kind, p) in r["pass"][0].items():
                vals = [r[c][0].get(cell, (kind, None))[1] for c in ("a", "b")]
                if None in vals or not p:
                    continue
                q = [p / v if kind == "time" else v / p for v in vals]
                for c, x in zip("ab", q):
                    ratios.setdefault(cell, {}).setdefault(c, []).append(x)
                fmt = "{:.0f}" if kind == "cpu" else "{:.1f}"
                p_, a_, b_ = (fmt.format(x) for x in (p, *vals))
                print(f"| {rnd} | {cell} | {p_} | {a_} | {b_} | {q[0]:.2f} | {q[1]:.2f} |")
            chk = "; ".join(c + " " + "/".join(check(x) for x in r[c][1]) for c in ("pass", "a", "b"))
            print(f"| {rnd} | disk checks µs (steal %) | {chk} | | | | |")
        for cell, q in ratios.items():
            print(f"| median of {len(q['a'])} | {cell} | | | | {statistics.median(q['a']):.2f} | {statistics.median(q['b']):.2f} |")


if __name__ == "__main__":
    main()
