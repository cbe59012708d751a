#!/usr/bin/env python3
"""Per run of run.sh: the seqread passes' times and the FUSE READ requests' latencies (from
the tracepoints): count, p50, p99, max, and how many took over 4 ms. Usage: reads.py OUT"""
import collections, glob, json, os, re, subprocess, sys

def reads(path):
    out = subprocess.run(["perf", "script", "-i", path, "-F", "time,event,trace"], capture_output=True, text=True).stdout
    send, lat = {}, []
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+):\s+(\S+):\s+(.*)", line)
        if not m:
            continue
        t, ev, tr = float(m[1]), m[2], m[3]
        q, c = re.search(r"req (\d+)", tr), re.search(r"connection (\d+)", tr)
        k = (c[1], q[1])
        if "send" in ev:
            send[k] = (t, re.search(r"\((\w+)\)", tr)[1])
        elif k in send:
            t0, op = send.pop(k)
            if op == "FUSE_READ":
                lat.append((t - t0) * 1e6)
    return sorted(lat)

print("| run | pass 1 (s) | pass 2 (s) | READs | p50 µs | p99 µs | max µs | over 4 ms | stream probes |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for d in sorted(glob.glob(os.path.join(sys.argv[1], "[AB]*")), key=lambda p: (os.path.basename(p)[1:], os.path.basename(p)[0])):
    try:
        doc = json.load(open(os.path.join(d, "paper-raw.json")))
    except OSError:
        continue
    r = [x for x in doc["runs"] if x["config"] == "farcache"][0]
    p = [x["secs"] for x in r["passes"]]
    probes = (r["passes"][-1].get("mount") or {}).get("adaptive_probes", 0)
    l = reads(os.path.join(d, "fuse.data"))
    pct = lambda q: l[min(len(l) - 1, int(q * len(l)))]
    print(f"| {os.path.basename(d)} | {p[0]:.3f} | {p[1]:.3f} | {len(l)} | {pct(.5):.0f} | {pct(.99):.0f} | {l[-1]:.0f} | {sum(x > 4000 for x in l)} | {probes} |")
