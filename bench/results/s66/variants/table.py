import glob, importlib.util, json, math, os, statistics as st, sys
spec = importlib.util.spec_from_file_location("t", "/work/main/scripts/nothing-slower-table.py")
t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
root = sys.argv[1]
for lab in sorted(os.listdir(root)):
    res, cpu, fills = {1: [], 2: []}, {"passthrough": [], "farcache": []}, []
    for d in sorted(glob.glob(os.path.join(root, lab, "B*"))):
        try: runs = {r["config"]: r for r in json.load(open(os.path.join(d, "paper-raw.json")))["runs"]}
        except Exception: continue
        if len(runs) < 2: continue
        for i in (0, 1):
            res[i + 1].append(runs["passthrough"]["passes"][i]["secs"] / runs["farcache"]["passes"][i]["secs"])
        for c in cpu: cpu[c].append(runs[c]["passes"][0].get("daemon_cpu_ms", 0))
        fills.append(runs["farcache"]["mount_stats"]["engine"]["fills"])
    if not res[1]: continue
    for p, v in res.items():
        b, a = sum(x < 1 for x in v), sum(x > 1 for x in v)
        gm = math.exp(sum(map(math.log, v)) / len(v))
        print(f"{lab} pass {p}: n {len(v)} median {st.median(v):.3f} geomean {gm:.3f} below/above {b}/{a} p {t.sign_test(b, a):.3f}  ", " ".join(f"{x:.2f}" for x in v))
    print(f"{lab} pass 1 daemon CPU ms median: pass {st.median(cpu['passthrough']):.0f} farcache {st.median(cpu['farcache']):.0f}; fills median {st.median(fills)}")
