#!/usr/bin/env python3
"""Why postmark through the mount is a fraction of native ext4 (issue 12's postmark targets
are against the backing alone): FUSE requests per transaction, and time per request.

postmark with Table 1's medium setting (SIZES 30,000-100,000 B, FILES 10,000 files; TRANSACTIONS
transactions; the small setting's 30,000 files need more open descriptors than the mount
daemon may hold on this machine, 20,000) on the VM's disk: native (a directory under /var/tmp), through `farcache mount
--no-remote` (no tier) and with a dram tier (/dev/shm). Per run: wall time, transactions/s,
the mount's FUSE requests by opcode (`farcache stats --json`, before and after), requests per
transaction, wall and daemon CPU microseconds per request, and the machine's busy CPUs.

Usage (root; postmark):
  BIN=target/release/farcache python3 bench/results/paper003-s35/pm.py [OUT_DIR]
  env: TRANSACTIONS (30000), FILES (10000), SIZES ("30000 100000"), ROUNDS (2), DIR (/var/tmp/fc-pm)
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts"))
import procstat  # noqa: E402
from procstat import HZ, proc_cpu  # noqa: E402

BIN = os.environ.get("BIN", "target/release/farcache")
TX = int(os.environ.get("TRANSACTIONS", "30000"))
FILES = int(os.environ.get("FILES", "10000"))
SIZES = os.environ.get("SIZES", "30000 100000")
ROUNDS = int(os.environ.get("ROUNDS", "2"))
DIR = os.environ.get("DIR", "/var/tmp/fc-pm")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
DRAM_TIER = "/dev/shm/fc-pm.tier"
MOUNTS = {
    "passthrough": ["--no-remote"],
    "tier-dram": ["--no-remote", "--tier", DRAM_TIER, "--tier-size", "2GiB"],
}


def ops(mp):
    r = subprocess.run([BIN, "stats", mp, "--json"], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["fuse"]["ops"]


def postmark(where, tag):
    os.makedirs(f"{where}/work", exist_ok=True)
    script = f"{DIR}/pm-{tag}.pm"
    with open(script, "w") as f:
        f.write(f"set location {where}/work\nset size {SIZES}\nset number {FILES}\n"
                f"set transactions {TX}\nset seed 42\nrun\nquit\n")
    t0 = time.monotonic()
    out = subprocess.run(["postmark", script], capture_output=True, text=True, check=True).stdout
    wall = time.monotonic() - t0
    with open(f"{OUT}/pm-{tag}.out", "w") as f:
        f.write(out)
    # Postmark deletes all it created; fewer deletes: operations failed (it goes on).
    count = lambda what: int(next(l for l in out.split("\n") if what in l).split()[0])
    if count(" created (") != count(" deleted ("):
        sys.exit(f"postmark's operations failed in {where}: see {OUT}/pm-{tag}.out")
    return wall


def run(name, tag):
    os.makedirs(f"{DIR}/b", exist_ok=True)
    if name == "native":
        b0 = procstat.stat()["busy"]
        wall = postmark(f"{DIR}/b", tag)
        return {"config": name, "wall_s": wall, "tx_per_s": TX / wall, "busy_cpus": (procstat.stat()["busy"] - b0) / HZ / wall}
    mp = f"{DIR}/m-{name}"
    ready = lambda m: subprocess.run([BIN, "stats", m, "--json"], capture_output=True).returncode == 0
    p = procstat.mount(BIN, MOUNTS[name], f"{DIR}/b", mp, f"{OUT}/mount-{name}.log", ready)
    o0, b0, d0 = ops(mp), procstat.stat()["busy"], proc_cpu(p.pid)
    wall = postmark(mp, tag)
    o1, b1, d1 = ops(mp), procstat.stat()["busy"], proc_cpu(p.pid)
    procstat.unmount(p, mp, timeout=300)
    by_op = {k: o1[k] - o0.get(k, 0) for k in o1 if o1[k] - o0.get(k, 0) > 0}
    n = sum(by_op.values())
    return {"config": name, "wall_s": wall, "tx_per_s": TX / wall, "busy_cpus": (b1 - b0) / HZ / wall,
            "requests": n, "requests_per_tx": n / TX, "wall_us_per_request": wall / n * 1e6,
            "daemon_us_per_request": (d1 - d0) / HZ / n * 1e6, "by_op": by_op}


def main():
    os.makedirs(OUT, exist_ok=True)
    rows = []
    for r in range(ROUNDS):
        for name in ["native", *MOUNTS]:
            shutil.rmtree(DIR, ignore_errors=True)
            if os.path.exists(DRAM_TIER):
                os.remove(DRAM_TIER)
            row = run(name, f"{name}-{r}")
            row["round"] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(f"{OUT}/pm.json", "w") as f:
                json.dump({"transactions": TX, "rows": rows}, f, indent=1)
    shutil.rmtree(DIR, ignore_errors=True)
    if os.path.exists(DRAM_TIER):
        os.remove(DRAM_TIER)


main()
