#!/usr/bin/env python3
"""Self time per thread group and symbol, ms per run (samples / 2999 Hz), of prof.sh's
recordings of both configurations in DIR/R*/ (default /tmp/s66/pr2): first the totals per
thread group and object, then the 40 symbols farcache's daemon spends most more time in."""
import collections, glob, re, subprocess, sys

root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s66/pr2"
tot = {}
for c in ("passthrough", "farcache"):
    acc, n = collections.defaultdict(float), 0
    for f in glob.glob(f"{root}/R*/perf-{c}-*.data"):
        n += 1
        out = subprocess.run(["perf", "report", "-i", f, "--no-children", "--sort", "comm,dso,sym", "--stdio",
                              "-F", "sample,comm,dso,sym"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.match(r"\s*(\d+)\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
            if m:
                comm = re.sub(r"[-\d]+$", "", m.group(2))
                acc[(comm, m.group(3), m.group(5).strip())] += int(m.group(1)) / 2999 * 1000
    tot[c] = {k: v / max(n, 1) for k, v in acc.items()}
    print(f"{c}: {n} runs")
for c in tot:
    d = collections.defaultdict(float)
    for k, v in tot[c].items():
        d[(k[0], k[1])] += v
    print(c, ", ".join(f"{a} {b} {v:.0f} ms" for (a, b), v in sorted(d.items(), key=lambda x: -x[1]) if v > 3))
keys = set(tot["passthrough"]) | set(tot["farcache"])
rows = sorted(keys, key=lambda k: -(tot["farcache"].get(k, 0) - tot["passthrough"].get(k, 0)))
print("ms per run: passthrough, farcache, thread, object, symbol")
for k in rows[:40]:
    print(f"{tot['passthrough'].get(k, 0):6.1f} {tot['farcache'].get(k, 0):6.1f}  {k[0][:15]:15} {k[1][:14]:14} {k[2][:80]}")
