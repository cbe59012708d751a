import subprocess, sys, re, collections
def lat(path):
    out = subprocess.run(["perf","script","-i",path,"-F","time,event,trace"],capture_output=True,text=True).stdout
    send = {}; res = collections.defaultdict(list)
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+):\s+(\S+):\s+(.*)", line)
        if not m: continue
        t, ev, tr = float(m.group(1)), m.group(2), m.group(3)
        q = re.search(r"req (\d+)", tr); c = re.search(r"connection (\d+)", tr)
        k = (c.group(1), q.group(1))
        if "send" in ev:
            op = re.search(r"\((\w+)\)", tr).group(1)
            send[k] = (t, op)
        elif k in send:
            t0, op = send.pop(k); res[op].append((t - t0) * 1e6)
    return res
def pct(v, p):
    v = sorted(v); return v[min(len(v)-1, int(p*len(v)))]
a, b = lat(sys.argv[1]), lat(sys.argv[2])
print(f"{'op':14} {'n pass':>8} {'n farc':>8} | {'p50':>7} {'p50':>7} | {'mean':>7} {'mean':>7} {'ratio':>5} | {'p90':>7} {'p90':>7} | {'p99':>8} {'p99':>8}")
for op in sorted(set(a) | set(b), key=lambda o: -len(a.get(o, []))):
    x, y = a.get(op, [0]), b.get(op, [0])
    mx, my = sum(x)/len(x), sum(y)/len(y)
    print(f"{op:14} {len(x):8} {len(y):8} | {pct(x,.5):7.0f} {pct(y,.5):7.0f} | {mx:7.0f} {my:7.0f} {my/mx if mx else 0:5.2f} | {pct(x,.9):7.0f} {pct(y,.9):7.0f} | {pct(x,.99):8.0f} {pct(y,.99):8.0f}")
