#!/usr/bin/env python3
"""The mount daemon's CPU per TPC-B transaction, passthrough against farcache, from `perf report`
text saved beside this script (session 37).

Each directory holds, per configuration C (passthrough, farcache): comm-C.txt, dso-C.txt and
sym-C.txt, the outputs of
    perf report -i perf-C.data --no-children --sort {comm,dso,sym} --stdio -g none
of `perf record -F 1999 -g -p <daemon> -- sleep 20` taken during the TPC-B run (../watch.sh);
samples.txt, the samples of each (passthrough's, then farcache's: `perf script -i perf-C.data |
grep -c cpu-clock`); and bench.log, the harness's log, whose "[pgbench C tpc-b N clients] T tps"
lines give the rate. A sample is 1/1999 s
of one CPU; per transaction = samples x (1e6/1999) us / (tps x 20 s).

    python3 bench/results/tpcb-profile-s37/per-tx.py [DIR ...]

With DIRs (each laid out as above, e.g. bench/results/tpcb-profile-s42/cloud-1client), those;
without, this script's own subdirectories.
"""
import collections
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
HZ, SECS = 1999, 20
CONFIGS = ("passthrough", "farcache")


def samples(d: pathlib.Path, c: str) -> int:
    """Samples perf recorded (samples.txt)."""
    return int((d / "samples.txt").read_text().split()[CONFIGS.index(c)])


def tps(d: pathlib.Path, c: str) -> float:
    for line in (d / "bench.log").read_text().splitlines():
        m = re.search(rf"\[pgbench {c} tpc-b \d+ clients\] (\d+) tps", line)
        if m:
            return float(m.group(1))
    raise SystemExit(f"{d}/bench.log: no TPC-B line for {c}")


def table(d: pathlib.Path, kind: str, user_only: bool = False, top: int = 0) -> None:
    per = {}
    for c in CONFIGS:
        scale = samples(d, c) * (1e6 / HZ) / (tps(d, c) * SECS)
        acc = collections.Counter()
        for line in (d / f"{kind}-{c}.txt").read_text().splitlines():
            m = re.match(r"\s*([\d.]+)%\s+(.+)$", line)
            if not m:
                continue
            key = m.group(2).strip()
            if kind == "comm":
                key = re.sub(r"[-\d]+$", "", key)
            if kind == "sym":
                if user_only and not key.startswith("[.]"):
                    continue
                key = key[4:]
            acc[key[:100]] += float(m.group(1)) / 100 * scale
        per[c] = acc
    keys = set(per["passthrough"]) | set(per["farcache"])
    diff = lambda k: per["farcache"].get(k, 0) - per["passthrough"].get(k, 0)  # noqa: E731
    keys = sorted(keys, key=lambda k: (-round(diff(k), 6), k))
    if top:
        keys = keys[:top]
    print(f"\n| {kind}{' (user space)' if user_only else ''} | passthrough | farcache | difference |")
    print("|---|---:|---:|---:|")
    for k in keys:
        p, f = per["passthrough"].get(k, 0), per["farcache"].get(k, 0)
        if max(p, f) >= 0.3:
            print(f"| `{k}` | {p:.1f} | {f:.1f} | {f - p:+.1f} |")
    if not top:
        tp, tf = sum(per["passthrough"].values()), sum(per["farcache"].values())
        print(f"| total | {tp:.1f} | {tf:.1f} | {tf - tp:+.1f} |")


DIRS = [pathlib.Path(a) for a in sys.argv[1:]] or sorted(p for p in HERE.iterdir() if p.is_dir())
for d in DIRS:
    print(f"\n## {d.name}: µs of the daemon's CPU per transaction "
          f"(passthrough {tps(d, 'passthrough'):.0f} tps, farcache {tps(d, 'farcache'):.0f} tps)")
    table(d, "comm")
    table(d, "dso")
    table(d, "sym", user_only=True, top=15)
