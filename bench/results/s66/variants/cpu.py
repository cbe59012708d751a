import glob, importlib.util, json, math, os, statistics as st, sys
spec = importlib.util.spec_from_file_location("t", "/work/main/scripts/nothing-slower-table.py")
t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
root = sys.argv[1]
for lab in sorted(os.listdir(root)):
    v=[]; fl=[]
    for d in glob.glob(os.path.join(root, lab, "B*")):
        try: runs = {r["config"]: r for r in json.load(open(os.path.join(d, "paper-raw.json")))["runs"]}
        except Exception: continue
        if len(runs)<2: continue
        a,b=runs["passthrough"]["passes"][0], runs["farcache"]["passes"][0]
        # CPU per FUSE read: daemon cpu per pass / secs-normalized? use cpu ratio
        v.append(b["daemon_cpu_ms"]/a["daemon_cpu_ms"])
    b_, a_ = sum(x > 1 for x in v), sum(x < 1 for x in v)
    print(f"{lab}: farcache/passthrough daemon CPU pass 1: n {len(v)} median {st.median(v):.3f} geomean {math.exp(sum(map(math.log,v))/len(v)):.3f} more/less {b_}/{a_} p {t.sign_test(b_, a_):.3f}")
