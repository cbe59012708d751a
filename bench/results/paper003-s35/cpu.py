#!/usr/bin/env python3
"""Where a durable 4 KiB write's CPU goes (issue 12's group-commit target: an ssd tier with 32
writers at >= 20x its own rate with one).

Each configuration takes 4 KiB pwrite + fdatasync pairs at random blocks (fio, psync,
fdatasync=1), by 1 writer and by 32 writers each in a file of its own, for SECS seconds;
the configurations take turns, ROUNDS rounds. Per run: writes/s, the machine's busy CPU
(/proc/stat: everything but idle and iowait; steal apart), the mount daemon's CPU
(/proc/PID/stat, all threads) and context switches (/proc/stat ctxt) -- each per write, the
CPUs busy, and a tier's counters (`farcache stats`: group commits, flushes of its medium). Then `perf record -a -g` over 32 writers through each tier.

  native       the files on the VM's disk (ext4 under /var/tmp), no mount
  passthrough  farcache mount --no-remote, no tier (every write and fdatasync to that disk)
  tier-dram    the same with a tier on /dev/shm (tmpfs)
  tier-ssd     the same with a tier file under /var/tmp (an ssd tier, commit = "fsync")

Usage (root; fio, perf):
  BIN=target/release/farcache python3 bench/results/paper003-s35/cpu.py [OUT_DIR]
  env: SECS (10), ROUNDS (2), DIR (/var/tmp/fc-durable-cpu), PERF (1), FILE_MIB (16),
       CONFIGS ("native passthrough tier-dram tier-ssd")
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
SECS = int(os.environ.get("SECS", "10"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
DIR = os.environ.get("DIR", "/var/tmp/fc-durable-cpu")
PERF = os.environ.get("PERF", "1") == "1"
FILE_MIB = int(os.environ.get("FILE_MIB", "16"))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
WRITERS = [1, 32]
DRAM_TIER = "/dev/shm/fc-durable-cpu.tier"

CONFIGS = os.environ.get("CONFIGS", "native passthrough tier-dram tier-ssd").split()
MOUNTS = {
    "passthrough": ["--no-remote"],
    "tier-dram": ["--no-remote", "--tier", DRAM_TIER, "--tier-size", "1GiB"],
    "tier-ssd": ["--no-remote", "--tier", f"{DIR}/ssd.tier", "--tier-size", "1GiB"],
}


def fio_args(d, jobs, secs):
    return ["fio", "--name=w", f"--directory={d}", f"--size={FILE_MIB}M", "--rw=randwrite",
            "--bs=4k", "--ioengine=psync", "--fdatasync=1", f"--numjobs={jobs}",
            "--group_reporting", f"--runtime={secs}", "--time_based"]


def fio(d, jobs, tag):
    out = f"{OUT}/fio-{tag}.json"
    cmd = fio_args(d, jobs, SECS) + ["--output-format=json", f"--output={out}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        j = json.load(f)["jobs"][0]
    return j["write"]["iops"]


def mount(name):
    mp = f"{DIR}/m-{name}"
    p = procstat.mount(BIN, MOUNTS[name], f"{DIR}/b", mp, f"{OUT}/mount-{name}.log",
                       lambda m: os.path.exists(f"{m}/w.0.0"))
    return p, mp


def run(name, jobs, tag):
    p, d = None, f"{DIR}/b"
    if name != "native":
        p, d = mount(name)
    subprocess.run(["sync"])
    a, d0 = stat(), proc_cpu(p.pid if p else None)
    iops = fio(d, jobs, tag)
    b, d1 = stat(), proc_cpu(p.pid if p else None)
    tier = {}
    if p:
        r = subprocess.run([BIN, "stats", d, "--json"], capture_output=True, text=True)
        t = json.loads(r.stdout).get("tier") if r.returncode == 0 else None
        if t:
            tier = {k: t.get(k) for k in ("writes", "groups", "flushes", "commits", "appends", "fsyncs_absorbed")}
        procstat.unmount(p, d)
    n = iops * SECS
    us = lambda ticks: ticks / HZ / n * 1e6
    return {"config": name, "writers": jobs, "writes_per_s": iops, "busy_us": us(b["busy"] - a["busy"]),
            "steal_us": us(b["steal"] - a["steal"]), "daemon_us": us(d1 - d0),
            "ctxt_per_write": (b["ctxt"] - a["ctxt"]) / n, "busy_cpus": (b["busy"] - a["busy"]) / HZ / SECS,
            "tier": tier}


def perf(name):
    p, mp = mount(name)
    f = subprocess.Popen(fio_args(mp, 32, 14), stdout=subprocess.DEVNULL)
    time.sleep(3)
    data = f"{DIR}/perf-{name}.data"
    procstat.perf_record(data, 8)
    f.wait()
    procstat.unmount(p, mp)
    procstat.perf_summaries(data, f"{OUT}/perf-{name}", 40)


def main():
    os.makedirs(OUT, exist_ok=True)
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(f"{DIR}/b", exist_ok=True)
    # The 32 files, written whole once (w.N.0: fio's names), so no run allocates blocks.
    subprocess.run(["fio", "--name=w", f"--directory={DIR}/b", f"--size={FILE_MIB}M", "--rw=write",
                    "--bs=1M", "--numjobs=32", "--end_fsync=1"], check=True, stdout=subprocess.DEVNULL)
    rows = []
    for r in range(ROUNDS):
        for jobs in WRITERS:
            for name in CONFIGS:
                row = run(name, jobs, f"{name}-{jobs}-{r}")
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(f"{OUT}/cpu.json", "w") as o:
                    json.dump({"secs": SECS, "file_mib": FILE_MIB, "rows": rows}, o, indent=1)
    if PERF:
        for name in ("tier-dram", "tier-ssd"):
            perf(name)
    shutil.rmtree(DIR, ignore_errors=True)
    for t in (DRAM_TIER,):
        if os.path.exists(t):
            os.remove(t)


main()
