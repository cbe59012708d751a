#!/usr/bin/env python3
"""ratios.txt from run.sh's directory (default /tmp/s65/rr2): per pass the ratios
(passthrough ÷ farcache time), median, geometric mean, sign test, and pass 1's daemon CPU."""
import glob, importlib.util, json, math, os, statistics as st, sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("t", os.path.join(here, "../../../../scripts/nothing-slower-table.py"))
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/s65/rr2"
res, cpu = {1: [], 2: []}, {"passthrough": [], "farcache": []}
for d in sorted(glob.glob(os.path.join(root, "B*")), key=lambda p: int(p.rsplit("B", 1)[-1])):
    runs = {r["config"]: r for r in json.load(open(os.path.join(d, "paper-raw.json")))["runs"]}
    for i in (0, 1):
        res[i + 1].append(runs["passthrough"]["passes"][i]["secs"] / runs["farcache"]["passes"][i]["secs"])
    for c in cpu:
        cpu[c].append(runs[c]["passes"][0].get("daemon_cpu_ms", 0))
print(f"raw randread 256 MiB, build 34400ae, {len(res[1])} back-to-back pairs (odd: passthrough first)")
for p, v in res.items():
    b, a = sum(x < 1 for x in v), sum(x > 1 for x in v)
    gm = math.exp(sum(map(math.log, v)) / len(v))
    print(f"pass {p}: n {len(v)} median {st.median(v):.3f} geomean {gm:.3f} below/above {b}/{a} "
          f"sign test p {t.sign_test(b, a):.3f}  ", " ".join(f"{x:.2f}" for x in v))
print("pass 1 daemon CPU (ms), median: passthrough %.0f, farcache %.0f" % (st.median(cpu["passthrough"]), st.median(cpu["farcache"])))
