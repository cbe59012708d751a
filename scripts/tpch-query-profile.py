#!/usr/bin/env python3
"""Each TPC-H power-test query of a `farcache bench paper --experiment tpch --watch-stats D`
run, side by side for every configuration: its time, and what its mount did while it ran —
FUSE reads, disk reads and their mean time, lender fetches and their mean time, MiB fetched
from and sent to the lenders, the disk's share of random reads at its end, and the mount
daemon's CPU time (per FUSE read too).

    python3 scripts/tpch-query-profile.py OUT/paper-PROFILE.json [--stats OUT/stats] [--stream N]

The series are OUT/stats/tpch-CONFIG.mount.stats.jsonl, or the same gzipped (.gz), one per
mounted configuration (the passthrough's since session 68); each document has the wall clock it was taken at (`unix_ms`)
and each query its psql's start (`started_unix_ms`), so a query gets the counters of the
intervals it overlaps, each in proportion to the overlap (a query shorter than an interval
gets its share of the interval's counts: read those rows as rates, not counts). `--stream`
picks a throughput stream instead of the power test (0). What the profile is for: where in a
run one configuration lost time to the other, and whether the mount did anything different
there (BENCHMARKS.md, session 68).
"""

import importlib.util
import json
import os
import sys

# stats-series.py's reader of watch files (its name is not a module name).
_spec = importlib.util.spec_from_file_location("stats_series", os.path.join(os.path.dirname(os.path.abspath(__file__)), "stats-series.py"))
SERIES = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SERIES)

# (column, path into the stats document); sums of what the interval added.
COUNTS = [
    ("reads", ("fuse", "ops", "read")),
    ("disk_n", ("backing", "read_latency", "count")),
    ("disk_us", ("backing", "read_latency", "sum_us")),
    ("fetch_n", ("remote", "fetch_latency", "count")),
    ("fetch_us", ("remote", "fetch_latency", "sum_us")),
    ("in", ("remote", "bytes_from_servers")),
    ("out", ("remote", "bytes_to_servers")),
    ("cpu_user", ("cpu", "user_us")),
    ("cpu_sys", ("cpu", "system_us")),
]


def load_series(path):
    """The documents of one watch file that carry a wall clock, in order; (docs, skipped lines)
    — read by stats-series.py's reader (plain or gzipped, a line cut short skipped)."""
    docs, bad = SERIES.docs_of(path)
    timed = [d for d in docs if isinstance(d.get("unix_ms"), int) and d["unix_ms"] > 0]
    timed.sort(key=lambda d: d["unix_ms"])
    return timed, bad + len(docs) - len(timed)


def profile(docs, start_ms, end_ms):
    """The counters the intervals overlapping [start_ms, end_ms) added, each interval's in
    proportion to its overlap; None where the series does not cover the span, or a counter
    is missing (an older daemon, or the passthrough's lender counters)."""
    if not docs or docs[0]["unix_ms"] > start_ms or docs[-1]["unix_ms"] < end_ms:
        return None
    out = {name: 0.0 for name, _ in COUNTS}
    missing = set()
    share = None
    for a, b in zip(docs, docs[1:]):
        lo, hi = a["unix_ms"], b["unix_ms"]
        if hi <= start_ms or lo >= end_ms or hi <= lo:
            continue
        if a.get("pid") != b.get("pid"):
            return None  # the daemon restarted inside the span: its counters started again
        part = (min(hi, end_ms) - max(lo, start_ms)) / (hi - lo)
        for name, keys in COUNTS:
            x, y = SERIES.at(a, keys), SERIES.at(b, keys)
            if x is None or y is None:
                missing.add(name)
            else:
                out[name] += part * (y - x)
        s = SERIES.at(b, ("routing", "adaptive", "disk_share"))
        share = s if s is not None else share
    for name in missing:
        out[name] = None
    out["share"] = share
    return out


def cells(p):
    """The printed columns of one profile."""
    if p is None:
        return ["-"] * 7

    def f(x, digits=0):
        return "-" if x is None else f"{x:,.{digits}f}"

    def mean(n, us):
        return "-" if n is None or us is None or n < 0.5 else f"{us / n:,.0f}"

    cpu = None if p["cpu_user"] is None or p["cpu_sys"] is None else p["cpu_user"] + p["cpu_sys"]
    per_read = "-" if cpu is None or not p["reads"] else f"{cpu / p['reads']:.1f}"
    mib = lambda x: "-" if x is None else f"{x / 2**20:,.0f}"
    return [
        f(p["reads"]),
        f"{f(p['disk_n'])} / {mean(p['disk_n'], p['disk_us'])}",
        f"{f(p['fetch_n'])} / {mean(p['fetch_n'], p['fetch_us'])}",
        f"{mib(p['in'])} / {mib(p['out'])}",
        "-" if p["share"] is None else f"{p['share']:.2f}",
        "-" if cpu is None else f"{cpu / 1000:,.0f}",
        per_read,
    ]


def main(argv):
    paper, stats_dir, stream = None, None, 0
    it = iter(argv)
    for a in it:
        if a == "--stats":
            stats_dir = next(it, None)
        elif a == "--stream":
            try:
                stream = int(next(it))
            except (StopIteration, ValueError):
                sys.exit("tpch-query-profile: --stream takes a stream number (0: the power test)")
        else:
            paper = a
    if not paper:
        sys.exit("usage: tpch-query-profile.py OUT/paper-PROFILE.json [--stats OUT/stats] [--stream N]")
    try:
        with open(paper) as f:
            j = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"tpch-query-profile: cannot read {paper}: {getattr(e, 'strerror', None) or e}")
    stats_dir = stats_dir or os.path.join(os.path.dirname(paper) or ".", "stats")
    runs = [r for r in (j.get("tpch") or []) if isinstance(r, dict)]
    if not runs:
        sys.exit(f"tpch-query-profile: {paper} has no tpch runs")
    configs = []
    for r in runs:
        name = r.get("config", "?")
        path = os.path.join(stats_dir, f"tpch-{name}.mount.stats.jsonl")
        if not os.path.exists(path) and os.path.exists(path + ".gz"):
            path += ".gz"
        docs, bad = load_series(path) if os.path.exists(path) else ([], 0)
        if bad:
            print(f"tpch-query-profile: {path}: {bad} line(s) without a wall clock or not JSON, skipped", file=sys.stderr)
        if not docs:
            print(f"tpch-query-profile: no series with a wall clock for {name} ({path}): its columns are empty", file=sys.stderr)
        key = "power" if stream == 0 else "throughput"
        queries = {q["query"]: q for q in r.get(key) or [] if q.get("stream") == stream}
        configs.append((name, docs, queries))
    order = [q["query"] for q in next((r.get("power" if stream == 0 else "throughput") or [] for r in runs), [])
             if q.get("stream") == stream]
    head = ["reads", "disk n / µs", "fetches n / µs", "MiB in / out", "share", "cpu ms", "cpu µs/read"]
    names = [c[0] for c in configs]
    print(f"# {paper}, stream {stream}: {' | '.join(names)}\n")
    cols = ["query", "secs " + " / ".join(names)]
    for n in names:
        cols += [f"{n} {h}" for h in head]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    totals = {n: None for n in names}
    for qn in order:
        row = [f"q{qn}"]
        secs, prof = [], []
        for name, docs, queries in configs:
            q = queries.get(qn)
            if not q:
                secs.append("-")
                prof.append(None)
                continue
            secs.append(f"{q['secs']:.1f}")
            start = q.get("started_unix_ms")
            p = profile(docs, start, start + 1000 * q["wall_secs"]) if start else None
            prof.append(p)
            if p is not None:
                t = totals[name] or {k: 0.0 for k in p if k != "share"}
                for k in t:
                    t[k] = None if t[k] is None or p[k] is None else t[k] + p[k]
                totals[name] = t
        row.append(" / ".join(secs))
        for p in prof:
            row += cells(p)
        print("| " + " | ".join(row) + " |")
    row = ["all", " / ".join(f"{sum(q['secs'] for q in c[2].values()):.1f}" for c in configs)]
    for n in names:
        t = totals[n]
        row += cells(None if t is None else dict(t, share=None))
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
