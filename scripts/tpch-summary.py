#!/usr/bin/env python3
"""One line per `bench paper --experiment tpch` result directory: the three tests' times, the
daemon's memory after the run, where the reads went and each test's CPU time by who spent it.
Usage: python3 scripts/tpch-summary.py DIR...   (each DIR holds a paper-*.json)"""
import glob
import json
import os
import sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
for d in sys.argv[1:]:
    found = glob.glob(os.path.join(d, "paper-*.json"))
    if not found:
        print(f"{d}: no paper-*.json (a run not finished, or not a result directory)")
        continue
    runs = json.load(open(found[0])).get("tpch") or []
    for t in runs:
        if t.get("error"):
            print(f"{d} {t['config']}: failed: {t['error']}")
            continue
        print(f"{os.path.basename(d.rstrip('/'))} {t['config']}: load {t['load_secs']:.1f} s, power {t['power_secs']:.1f} s, "
              f"throughput {t['throughput_secs']:.1f} s = {t['queries_per_hour']:.0f} queries/h; daemon anonymous "
              f"{t['daemon_anon_bytes'] >> 20} MiB, resident {t['daemon_rss_bytes'] >> 20} MiB")
        m = t.get("mount") or {}
        if m:
            print(f"   lender reads {m['remote_reads']}, disk reads {m['backing_reads']}, "
                  f"{m['bytes_from_servers'] / 1e9:.1f} GB from lenders")
        for phase in ("load", "power_phase", "throughput_phase"):
            c = (t.get(phase) or {}).get("cpu") or {}
            if c:
                print(f"   {phase}: CPU s " + ", ".join(f"{k.removesuffix('_ms')} {v / 1e3:.1f}" for k, v in c.items()))
