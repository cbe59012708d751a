"""Who woke the lender runtime: perf script of watch-wakeups.sh's data, grouped by the waker's
comm and the first frames of its stack that are not the wake-up machinery itself."""
import collections, subprocess, sys
out = subprocess.run(["perf", "script", "-i", sys.argv[1], "-F", "comm,tid,ip,sym"], capture_output=True, text=True).stdout
skip = ["try_to_wake_up", "wake_up", "__wake", "futex", "do_syscall", "entry_SYSCALL", "syscall", "unpark", "[unknown]",
        "__x64", "pollwake", "__pollwait", "ep_", "default_wake", "autoremove", "wake"]
c, n = collections.Counter(), 0
for b in out.split("\n\n"):
    ls = [l.strip() for l in b.strip().splitlines()]
    if not ls:
        continue
    n += 1
    comm = ls[0].split()[0].rstrip("0123456789-")
    syms = [l.split(None, 1)[1].split("+0x")[0] if len(l.split(None, 1)) > 1 else "?" for l in ls[1:]]
    c[(comm, " | ".join([s for s in syms if not any(x in s for x in skip)][:4]))] += 1
print("wake-ups:", n)
for (comm, stack), v in c.most_common(25):
    print(v, comm, stack[:200])
