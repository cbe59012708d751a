"""What the CPU-accounting benchmark scripts share (bench/results/*/cpu.py, pm.py): the
machine's and a process's CPU from /proc, a mount daemon started and stopped, and a system-wide
perf recording summarised. Import with `sys.path.insert(0, "<repo>/scripts")`."""
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def stat():
    """The machine's busy and stolen CPU ticks (everything but idle and iowait; steal apart)
    and its context switches so far (/proc/stat)."""
    with open("/proc/stat") as f:
        lines = f.read().split("\n")
    cpu = [int(x) for x in lines[0].split()[1:]]
    ctxt = next(int(l.split()[1]) for l in lines if l.startswith("ctxt "))
    user, nice, system, idle, iowait, irq, softirq, steal = cpu[:8]
    return {"busy": user + nice + system + irq + softirq, "steal": steal, "ctxt": ctxt}


def proc_cpu(pid):
    """utime + stime of process `pid`, all its threads, in ticks (0 for None)."""
    if pid is None:
        return 0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def mount(bin_, args, backing, mp, log_path, ready):
    """Start `farcache mount ARGS BACKING MP` (log appended to LOG_PATH) and wait until
    `ready(mp)` holds (20 s at most); the process."""
    os.makedirs(mp, exist_ok=True)
    log = open(log_path, "a")
    p = subprocess.Popen([bin_, "mount", *args, backing, mp], stdout=log, stderr=log)
    for _ in range(400):
        if ready(mp):
            return p
        if p.poll() is not None:
            sys.exit(f"mount {mp} exited: see {log_path}")
        time.sleep(0.05)
    p.kill()
    sys.exit(f"mount {mp}: not ready in 20 s (see {log_path})")


def unmount(p, mp, timeout=120):
    """Unmount MP cleanly (a tier is written back first), lazily if its daemon hangs."""
    subprocess.run(["fusermount3", "-u", mp], check=False)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        subprocess.run(["umount", "-l", mp], check=False)


def perf_record(data, secs):
    """`perf record -a -g` of the whole machine for SECS seconds into DATA."""
    subprocess.run(["perf", "record", "-a", "-g", "-o", data, "--", "sleep", str(secs)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def perf_summaries(data, prefix, sym_lines=30):
    """PREFIX-comm.txt and PREFIX-sym.txt: the recording's top commands and symbols."""
    for sort, lim in (("comm", 12), ("sym", sym_lines)):
        r = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", sort,
                            "-g", "none", "--stdio", "--percent-limit", "0.7"],
                           capture_output=True, text=True)
        lines = [l for l in r.stdout.split("\n") if l.strip() and not l.startswith("#")]
        with open(f"{prefix}-{sort}.txt", "w") as o:
            o.write("\n".join(lines[:lim]) + "\n")
