#!/usr/bin/env python3
"""The A/B of run.sh (default directory /tmp/s66/sb): per build, pass 1 and 2 ratios
(passthrough ÷ farcache time) with median, geometric mean and sign test; the daemon's CPU in
pass 1 (farcache ÷ passthrough); and, from stat-procs.sh's counts (whole runs: both passes
and the harness's probe reads), the medians per run of CPU time, context switches and system
calls of farcache's lender runtime thread (`farcache-remote`), its FUSE threads, and the
lender server."""
import collections, glob, importlib.util, json, math, os, re, statistics as st, sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("t", os.path.join(here, "../../../../scripts/nothing-slower-table.py"))
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s66/sb"


def counts(path):
    """{thread name without digits: {event: value}} of one perf stat --per-thread file."""
    per = collections.defaultdict(lambda: collections.defaultdict(float))
    for line in open(path):
        m = re.match(r"\s*(\S+)-(\d+)\s+([\d,.]+)\s+(?:msec\s+)?(\S+)", line)
        if m:
            name, _, val, ev = m.groups()
            per[re.sub(r"[-\d]+$", "", name)][ev] += float(val.replace(",", ""))
    return per


def summary(v):
    b, a = sum(x < 1 for x in v), sum(x > 1 for x in v)
    gm = math.exp(sum(map(math.log, v)) / len(v))
    return f"n {len(v)} median {st.median(v):.3f} geomean {gm:.3f} below/above 1 {b}/{a} sign test p {t.sign_test(b, a):.3f}"


for b in sorted(os.listdir(root)):
    ratios, cpu, fills = {1: [], 2: []}, [], []
    threads = collections.defaultdict(list)
    for d in sorted(glob.glob(os.path.join(root, b, "R*")), key=lambda p: int(p.rsplit("R", 1)[-1])):
        try:
            runs = {r["config"]: r for r in json.load(open(os.path.join(d, "paper-raw.json")))["runs"]}
        except (OSError, ValueError):
            continue
        if len(runs) < 2:
            continue
        p, f = runs["passthrough"]["passes"], runs["farcache"]["passes"]
        for i in (1, 2):
            ratios[i].append(p[i - 1]["secs"] / f[i - 1]["secs"])
        cpu.append(f[0]["daemon_cpu_ms"] / p[0]["daemon_cpu_ms"])
        fills.append(runs["farcache"]["mount_stats"]["engine"]["fills"])
        for s in glob.glob(os.path.join(d, "stat-*-farcache-*.txt")) + glob.glob(os.path.join(d, "stat-mount-passthrough-*.txt")):
            kind = os.path.basename(s).split("-")[1] + "-" + os.path.basename(s).split("-")[2]
            for name, ev in counts(s).items():
                if name in ("farcache-remote", "fuser", "farcache-server"):
                    threads[(kind, name)].append(ev)
    if not cpu:
        continue
    print(f"## {b}: {len(cpu)} pairs")
    for i in (1, 2):
        print(f"pass {i} (passthrough ÷ farcache time): {summary(ratios[i])}")
        print("   ", " ".join(f"{x:.2f}" for x in ratios[i]))
    print(f"pass 1 daemon CPU (farcache ÷ passthrough): {summary(cpu)}")
    print(f"blocks filled per farcache run, median: {st.median(fills):.0f}")
    for (kind, name), evs in sorted(threads.items()):
        med = lambda k: st.median(e.get(k, 0) for e in evs)
        print(f"{kind:20} {name:16} runs {len(evs):3}  CPU {med('task-clock'):7.1f} ms  "
              f"context switches {med('context-switches'):8.0f}  system calls {med('raw_syscalls:sys_enter'):8.0f}")

# Builds A and B round by round: B's pass 1 ratio over A's (their farcache runs minutes apart).
per = {}
for b in ("A", "B"):
    for d in glob.glob(os.path.join(root, b, "R*")):
        try:
            runs = {r["config"]: r for r in json.load(open(os.path.join(d, "paper-raw.json")))["runs"]}
            per[(b, os.path.basename(d))] = runs["passthrough"]["passes"][0]["secs"] / runs["farcache"]["passes"][0]["secs"]
        except (OSError, ValueError, KeyError):
            pass
rounds = sorted({r for (_, r) in per}, key=lambda r: int(r[1:]))
v = [per[("B", r)] / per[("A", r)] for r in rounds if ("A", r) in per and ("B", r) in per]
if v:
    print(f"## B ÷ A, pass 1 ratio round by round: median {st.median(v):.3f}, B ahead / behind {sum(x > 1 for x in v)}/{sum(x < 1 for x in v)}")
