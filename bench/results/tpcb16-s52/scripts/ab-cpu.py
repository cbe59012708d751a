import json, sys, glob, os, statistics as st
root = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{root}/*/*/paper-*.json")):
    rnd, cfg = os.path.basename(os.path.dirname(f)).split("-", 1)
    d = json.load(open(f))
    for x in d["pgbench"]:
        if x.get("error") or not x["transactions"]: continue
        tx = x["transactions"]; c = x["cpu"]; th = x.get("daemon_threads_ms") or {}
        dk = x["disk"]; ln = x["lenders"] or {}
        ticks = dk.get("cpu_ticks", 0) or 1
        rows[(x["mode"], int(rnd), cfg)] = dict(
            tps=x["tps"], machine=1000*c["machine_ms"]/tx, client=1000*c["client_ms"]/tx, daemon=1000*c["daemon_ms"]/tx,
            fuser=1000*th.get("fuser-", 0)/tx, iou=1000*th.get("iou-wrk-", 0)/tx, remote=1000*th.get("farcache-remote", 0)/tx,
            lenders=1000*c["lenders_ms"]/tx, dels=ln.get("dels", 0)/tx, reads=dk["read_ios"]/tx, steal=100*dk.get("steal_ticks", 0)/ticks)
cols = ["tps", "machine", "client", "daemon", "fuser", "iou", "remote", "lenders", "dels", "reads", "steal"]
for mode in ["select-only", "tpc-b"]:
    print(f"== {mode}")
    print("rnd cfg  " + " ".join(f"{c:>8}" for c in cols) + "   ratio")
    for rnd in sorted({k[1] for k in rows if k[0] == mode}):
        for cfg in ["pass", "a", "b"]:
            r = rows.get((mode, rnd, cfg))
            if not r: continue
            p = rows.get((mode, rnd, "pass"))
            ratio = r["tps"] / p["tps"] if p else float("nan")
            print(f"{rnd:3} {cfg:4} " + " ".join(f"{r[c]:8.2f}" if c in ('dels','reads','steal') else f"{r[c]:8.1f}" for c in cols) + f"   {ratio:.2f}")
    for cfg in ["pass", "a", "b"]:
        rs = [r for k, r in rows.items() if k[0] == mode and k[2] == cfg]
        if not rs: continue
        med = {c: st.median([r[c] for r in rs]) for c in cols}
        print(f"med {cfg:4} " + " ".join(f"{med[c]:8.2f}" if c in ('dels','reads','steal') else f"{med[c]:8.1f}" for c in cols))
    for cfg in ["a", "b"]:
        rat = [rows[(mode, k[1], cfg)]["tps"] / rows[(mode, k[1], "pass")]["tps"] for k in rows if k[0] == mode and k[2] == "pass" and (mode, k[1], cfg) in rows]
        if rat: print(f"tps ratio {cfg}/pass per round: {[round(x,2) for x in rat]} median {st.median(rat):.2f}")
