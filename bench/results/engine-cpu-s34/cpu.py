#!/usr/bin/env python3
"""Where a 4 KiB O_DIRECT random read's CPU goes: native, through the daemon, through the kernel's
FUSE passthrough (issue 11's shortfall at QD >= 16, explained by the machine's CPU budget).

Each configuration serves the same 1 GiB file on the VM's disk to fio (io_uring, randread,
4 KiB, O_DIRECT) for SECS seconds; the configurations take turns, ROUNDS rounds. Per run:
IOPS, the machine's busy CPU (/proc/stat: everything but idle and iowait, steal shown apart),
the daemon's CPU (/proc/PID/stat, all threads), fio's own (its JSON), and context switches
(/proc/stat ctxt) -- each per I/O. Then `perf record -a -g` over one run of each mount.

Usage (root; fio, perf):
  BIN=target/release/farcache python3 bench/results/engine-cpu-s34/cpu.py [OUT_DIR]
  env: QD (32), JOBS (1), SECS (15), ROUNDS (3), DIR (/var/tmp/fc-cpu-s34), PERF (1)
"""
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts"))
import procstat  # noqa: E402
from procstat import HZ, proc_cpu, stat  # noqa: E402

BIN = os.environ.get("BIN", "target/release/farcache")
QD = int(os.environ.get("QD", "32"))
JOBS = int(os.environ.get("JOBS", "1"))
SECS = int(os.environ.get("SECS", "15"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DIR = os.environ.get("DIR", "/var/tmp/fc-cpu-s34")
PERF = os.environ.get("PERF", "1") == "1"
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

MOUNTS = {
    "passthrough": ["--no-remote"],
    "farcache": [],
    "kernel": ["--no-remote", "--kernel-passthrough"],
}


def fio_args(path, secs):
    return ["fio", "--name=r", f"--filename={path}", "--size=1G", "--rw=randread", "--bs=4k",
            "--direct=1", "--ioengine=io_uring", f"--iodepth={QD}", f"--numjobs={JOBS}",
            "--group_reporting", f"--runtime={secs}", "--time_based"]


def fio(path, tag):
    out = f"{OUT}/fio-{tag}.json"
    cmd = fio_args(path, SECS) + ["--output-format=json", f"--output={out}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        j = json.load(f)["jobs"][0]
    return j["read"]["iops"], (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * SECS * JOBS


def mount(name):
    mp = f"{DIR}/m-{name}"
    p = procstat.mount(BIN, MOUNTS[name], f"{DIR}/b", mp, f"{OUT}/mount-{name}.log",
                       lambda m: os.path.exists(f"{m}/f"))
    return p, mp


def unmount(p, mp):
    procstat.unmount(p, mp, timeout=20)


def drop():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(name, tag):
    p, path = None, f"{DIR}/b/f"
    if name != "native":
        p, mp = mount(name)
        path = f"{mp}/f"
    drop()
    a, d0 = stat(), proc_cpu(p.pid if p else None)
    iops, fio_cpu = fio(path, tag)
    b, d1 = stat(), proc_cpu(p.pid if p else None)
    if p:
        unmount(p, mp)
    ios = iops * SECS
    us = lambda ticks: ticks / HZ / ios * 1e6
    return {"config": name, "iops": iops, "busy_us": us(b["busy"] - a["busy"]),
            "steal_us": us(b["steal"] - a["steal"]), "daemon_us": us(d1 - d0),
            "fio_us": fio_cpu / ios * 1e6, "ctxt_per_io": (b["ctxt"] - a["ctxt"]) / ios,
            "busy_cpus": (b["busy"] - a["busy"]) / HZ / SECS}


def perf(name):
    p, mp = mount(name)
    drop()
    f = subprocess.Popen(fio_args(f"{mp}/f", 14), stdout=subprocess.DEVNULL)
    time.sleep(3)
    data = f"{DIR}/perf-{name}.data"
    procstat.perf_record(data, 8)
    f.wait()
    unmount(p, mp)
    procstat.perf_summaries(data, f"{OUT}/perf-{name}")


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(f"{DIR}/b", exist_ok=True)
    if not os.path.exists(f"{DIR}/b/f") or os.path.getsize(f"{DIR}/b/f") != 1 << 30:
        subprocess.run(["fio", "--name=lay", f"--filename={DIR}/b/f", "--size=1G", "--rw=write",
                        "--bs=1M", "--direct=1"], check=True, stdout=subprocess.DEVNULL)
    rows = []
    for r in range(ROUNDS):
        for name in ["native", *MOUNTS]:
            row = run(name, f"{name}-{r}")
            row["round"] = r
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(f"{OUT}/cpu.json", "w") as o:
                json.dump({"qd": QD, "jobs": JOBS, "secs": SECS, "rows": rows}, o, indent=1)
    if PERF:
        for name in MOUNTS:
            perf(name)
    shutil.rmtree(DIR, ignore_errors=True)


main()
