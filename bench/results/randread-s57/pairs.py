#!/usr/bin/env python3
"""Per-pair ratios of raw randread 1 GiB runs (session 57): passthrough time ÷ farcache time per
pass, with each side's disk reads, page-cache share, daemon CPU (system part) and switches.
A pair whose directory says "contaminated" (a build ran beside it) is listed but left out of
the medians. Usage: pairs.py DIR... (each holding raw-randread/rep*/paper-raw.json)."""
import glob, json, statistics, sys

for top in sys.argv[1:]:
    print(f"\n### {top}\n")
    print("| pair | pass | passthrough s | farcache s | ratio | disk reads pt / fc | page cache pt / fc | daemon CPU ms pt / fc (system) | switches pt / fc | p99 µs pt / fc | lender hits / puts |")
    print("|---|---:|---:|---:|---:|---|---|---|---|---|---|")
    ratios = {1: [], 2: []}
    for f in sorted(glob.glob(f"{top}/raw-randread/rep*/paper-raw.json")):
        rep = f.split("/")[-2]
        runs = {r["config"]: r for r in json.load(open(f))["runs"]}
        if set(runs) != {"passthrough", "farcache"}:
            continue
        for i in range(2):
            p, c = runs["passthrough"]["passes"][i], runs["farcache"]["passes"][i]
            r = p["secs"] / c["secs"]
            if "contaminated" not in rep:  # listed, but out of the medians
                ratios[i + 1].append(r)
            sw = lambda x: sum(x.get("daemon_switches", {}).values())
            print(f"| {rep} | {i+1} | {p['secs']:.2f} | {c['secs']:.2f} | {r:.3f} | "
                  f"{p['disk']['read_ios']} / {c['disk']['read_ios']} | "
                  f"{p['hit_ratio_page_cache']*100:.1f}% / {c['hit_ratio_page_cache']*100:.1f}% | "
                  f"{p['daemon_cpu_ms']:.0f} ({p.get('daemon_sys_ms') or 0:.0f}) / {c['daemon_cpu_ms']:.0f} ({c.get('daemon_sys_ms') or 0:.0f}) | "
                  f"{sw(p)} / {sw(c)} | {p['lat_us_p99']:.0f} / {c['lat_us_p99']:.0f} | {c['lenders']['hits']} / {c['lenders']['puts']} |")
    for k, v in ratios.items():
        if v:
            print(f"\npass {k}: median ratio {statistics.median(v):.3f} of {len(v)} pairs (range {min(v):.3f}–{max(v):.3f})")
