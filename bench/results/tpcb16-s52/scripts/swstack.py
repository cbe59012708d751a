import subprocess, sys, collections
def load(path):
    out = subprocess.run(["perf","script","-i",path,"-F","comm,tid,ip,sym"],capture_output=True,text=True).stdout
    res = collections.Counter(); comms = collections.Counter()
    for block in out.split("\n\n"):
        lines = [l.strip() for l in block.strip().splitlines()]
        if not lines: continue
        comm = lines[0].split()[0]
        c = comm.rstrip("0123456789-").rstrip("-")
        syms = [l.split(None,1)[1] if len(l.split(None,1))>1 else "?" for l in lines[1:]]
        syms = [s.split("+0x")[0] for s in syms]
        key = None
        kern = [s for s in syms[:40]]
        # reason: first of these markers found
        for m in ["balance_dirty_pages","fuse_dev_do_read","io_cqring_wait","io_uring_cmd","fuse_uring","futex_wait","do_fsync","ext4_sync_file","jbd2","epoll_wait","rwsem","mutex_lock","io_wq_worker","schedule_timeout","do_nanosleep","filemap","blk_mq","__x64_sys_pwrite","__x64_sys_write"]:
            if any(m in s for s in kern):
                key = m; break
        if key is None: key = "other:" + "|".join(syms[1:4])
        if key == "futex_wait":
            # find user caller beyond parking_lot / std
            us = [s for s in syms if not any(x in s for x in ["futex","parking_lot","syscall","do_syscall","entry_SYSCALL","schedule","__x64","lock_slow","std::sys","park","Condvar","wait","[unknown]","__schedule","finish_task"])]
            key += ":" + "|".join(us[:3])
        res[(c, key)] += 1; comms[c] += 1
    return res, comms
a, ca = load(sys.argv[1]); b, cb = load(sys.argv[2])
print("switches by thread:", dict(ca), "||", dict(cb))
keys = sorted(set(a)|set(b), key=lambda k: -(b.get(k,0)-a.get(k,0)))
for k in keys[:25]+keys[-8:]:
    print(f"{a.get(k,0):6} {b.get(k,0):6} {b.get(k,0)-a.get(k,0):+6}  {k[0]:16} {k[1][:150]}")
