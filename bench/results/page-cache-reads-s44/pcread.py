import os, sys, time, subprocess, statistics, signal
BIN=sys.argv[1]; ROUNDS=int(sys.argv[2]) if len(sys.argv)>2 else 4
back='/var/tmp/s44/back'; mnt='/var/tmp/s44/mnt'
os.makedirs(back,exist_ok=True); os.makedirs(mnt,exist_ok=True)
f=os.path.join(back,'f')
if not os.path.exists(f) or os.path.getsize(f)!=256<<20:
    with open(f,'wb') as o:
        for i in range(256): o.write(os.urandom(1<<20))
srv=subprocess.Popen([BIN,'server','--listen','127.0.0.1:0','--capacity','512MiB'],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL,text=True)
addr=srv.stdout.readline().split()[-1]
print('server',addr)
def passes(path,n):
    out=[]
    for _ in range(n):
        fd=os.open(path,os.O_RDONLY); lat=[]; t0=time.perf_counter()
        while True:
            t=time.perf_counter(); b=os.read(fd,1<<20); lat.append(time.perf_counter()-t)
            if not b: break
        out.append((time.perf_counter()-t0, statistics.median(lat)*1e6)); os.close(fd)
    return out
res={'nr':[], 'fc':[]}
for r in range(ROUNDS):
    for cfg in (['nr','fc'] if r%2==0 else ['fc','nr']):
        args=[BIN,'mount',back,mnt]+(['--no-remote'] if cfg=='nr' else ['--server',addr])
        m=subprocess.Popen(args,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
        for _ in range(100):
            if os.path.ismount(mnt): break
            time.sleep(0.1)
        p=os.path.join(mnt,'f')
        passes(p,2)
        x=passes(p,10)
        res[cfg]+=x
        print(r,cfg,'pass s median %.4f'%statistics.median(a for a,_ in x),'read p50 us median %.0f'%statistics.median(b for _,b in x),flush=True)
        m.send_signal(signal.SIGTERM); m.wait(timeout=30)
srv.terminate(); srv.wait()
for k in res: print(k, 'median pass %.4f s'%statistics.median(a for a,_ in res[k]), 'median read p50 %.0f us'%statistics.median(b for _,b in res[k]))
