#!/usr/bin/env python3
"""A mount's counters over time, from `farcache stats MNT --watch D --json` (one document per
line; `farcache bench paper --watch-stats D` writes one such file per farcache run in
OUT/stats/): per interval, the reads the adaptive rule sent to the disk and to the lenders,
fills, read-arounds and probes, and the rule's state at its end (the disk's share of random
reads, disk ÷ lender cost, the lender hit estimate, the disk's window mean, the share of reads
the lenders hold, a lender miss's time, the probe back-off), and what it read (FUSE reads,
disk reads and lender fetches with their mean time, MiB from and to the lenders, and the
daemon's CPU time in it, per FUSE read too: the passthrough's series has all but the lenders',
to hold farcache's against); then a summary per series.

    python3 scripts/stats-series.py FILE... [--every N]     # every Nth interval (default 1)

A series is one mount daemon's: it starts again where the pid changes or the mount's clock
(`uptime_ms`; `uptime_secs` from older daemons) goes back. Lines that are not JSON (the last
one of a watch stopped mid-write) are skipped and counted on stderr. Documents of the older
ad-hoc watcher, `{"t": ..., "stats": {...}}`, are read too, and a FILE ending in .gz is read
through gzip.
"""

import gzip
import json
import sys

COUNTERS = [
    ("disk", "adaptive_disk"),
    ("lenders", "adaptive_remote"),
    ("fills", "fills"),
    ("read_arounds", "read_arounds"),
    ("probes", "adaptive_probes"),
]


def docs_of(path):
    """The stats documents of `path`, and how many of its lines were not documents."""
    docs, bad = [], 0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(d, dict) and isinstance(d.get("stats"), dict):
                d = d["stats"]
            if not isinstance(d, dict) or "engine" not in d:
                bad += 1
                continue
            docs.append(d)
    return docs, bad


def clock_ms(d):
    return d["uptime_ms"] if "uptime_ms" in d else 1000 * d.get("uptime_secs", 0)


def series_of(docs):
    """Split documents into one list per mount daemon run."""
    out = []
    for d in docs:
        cur = out[-1] if out else None
        if cur and cur[-1].get("pid") == d.get("pid") and clock_ms(d) >= clock_ms(cur[-1]):
            cur.append(d)
        else:
            out.append([d])
    return out


def adaptive(d):
    return (d.get("routing") or {}).get("adaptive") or {}


def fmt(x, digits=0):
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


def at(d, keys):
    """The number at `keys` (a path into the document); None if it has none there."""
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, (int, float)) else None


def delta(a, b, *keys):
    """b's counter at `keys` less a's; None if either lacks it."""
    x, y = at(a, keys), at(b, keys)
    return None if x is None or y is None else y - x


def io(a, b):
    """What the interval read, and what the reads took: the FUSE reads the kernel sent, the
    disk's reads (`backing`) and the lenders' fetches with their mean time, and the MiB
    fetched from and sent to the lenders. The passthrough's series (`--no-remote`) has the
    first two: what a farcache series is held against, second by second."""
    def mean(name, part):
        n, us = delta(a, b, part, name, "count"), delta(a, b, part, name, "sum_us")
        return "-" if n is None else f"{n} at {fmt(us / n) if n and us is not None else '-'} µs"
    reads = delta(a, b, "fuse", "ops", "read")
    got, sent = delta(a, b, "remote", "bytes_from_servers"), delta(a, b, "remote", "bytes_to_servers")
    mib = lambda x: "-" if x is None else f"{x / 2**20:.0f}"
    user, system = delta(a, b, "cpu", "user_us"), delta(a, b, "cpu", "system_us")
    cpu = ""
    if user is not None and system is not None:
        per_read = f" ({fmt((user + system) / reads)} µs a read)" if reads else ""
        cpu = f" cpu {fmt((user + system) / 1000)} ms{per_read}"
    return (
        f" | fuse reads {'-' if reads is None else reads} disk {mean('read_latency', 'backing')}"
        f" fetches {mean('fetch_latency', 'remote')} MiB in {mib(got)} out {mib(sent)}{cpu}"
    )


def rows(series, every=1):
    """One line per interval (every `every`th): counts in it, the rule's state at its end."""
    lines = []
    picked = series[::every]
    if series[-1] is not picked[-1]:
        picked.append(series[-1])
    for a, b in zip(picked, picked[1:]):
        ea, eb = a["engine"], b["engine"]
        secs = (clock_ms(b) - clock_ms(a)) / 1000
        counts = " ".join(f"{name} {eb.get(key, 0) - ea.get(key, 0)}" for name, key in COUNTERS)
        r = adaptive(b)
        lines.append(
            f"{clock_ms(b) / 1000:8.1f} s (+{secs:.1f}) {counts} | share {fmt(r.get('disk_share'), 3)}"
            f" d/r {fmt(r.get('disk_over_remote'), 2)} w {fmt(r.get('disk_weight'), 2)} hit {fmt(r.get('remote_hit_us'))} µs"
            f" disk {fmt(r.get('disk_window_mean_us'))} µs held {fmt(r.get('lenders_held'), 2)}"
            f" miss {fmt(r.get('lender_miss_us'))} µs backoff {r.get('probe_backoff', '-')}"
            + io(a, b)
        )
    return lines


def summary(series):
    first, last = series[0], series[-1]
    e0, e1 = first["engine"], last["engine"]
    shares = [adaptive(d)["disk_share"] for d in series if "disk_share" in adaptive(d)]
    below = sum(1 for s in shares if s < 1.0)
    span = (clock_ms(last) - clock_ms(first)) / 1000
    counts = ", ".join(f"{name} {e1.get(key, 0) - e0.get(key, 0)}" for name, key in COUNTERS)
    share = f"disk share lowest {min(shares):.3f}, below 1 in {below} of {len(shares)} samples" if shares else "no adaptive rule"
    return f"  over {span:.1f} s: {counts}; {share}"


def main(argv):
    every = 1
    paths = []
    it = iter(argv)
    for a in it:
        if a == "--every":
            try:
                every = int(next(it))
            except (StopIteration, ValueError):
                sys.exit("stats-series: --every takes a positive count, e.g. --every 5")
            if every < 1:
                sys.exit("stats-series: --every takes a positive count, e.g. --every 5")
        else:
            paths.append(a)
    if not paths:
        sys.exit("usage: stats-series.py FILE... [--every N]  (files of `farcache stats MNT --watch D --json`)")
    for path in paths:
        try:
            docs, bad = docs_of(path)
        except (OSError, EOFError) as e:
            sys.exit(f"stats-series: cannot read {path}: {getattr(e, 'strerror', None) or e}")
        if bad:
            print(f"stats-series: {path}: {bad} line(s) not a mount's stats document, skipped", file=sys.stderr)
        if not docs:
            print(f"== {path}: no stats documents")
            continue
        for s in series_of(docs):
            d = s[0]
            print(f"== {path}: pid {d.get('pid')}, backing {d.get('backing_dir')}, {len(s)} samples")
            for line in rows(s, every):
                print(line)
            print(summary(s))


if __name__ == "__main__":
    main(sys.argv[1:])
