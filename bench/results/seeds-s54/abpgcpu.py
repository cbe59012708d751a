import json,glob,sys,statistics as st,collections
# daemon FUSE-worker and whole-daemon CPU µs per transaction, per config, median over rounds
v=collections.defaultdict(list)
for f in glob.glob(sys.argv[1]+'/*/*/paper-*.json'):
  cfg=f.split('/')[-2].split('-',1)[1]
  for x in json.load(open(f)).get('pgbench') or []:
    t=x['transactions'] or 1
    k=(x['mode'],x['clients'])
    v[k+(cfg,'daemon')].append(1000*x['cpu']['daemon_ms']/t)
    v[k+(cfg,'fuse')].append(1000*(x.get('daemon_threads_ms') or {}).get('fuser-',0)/t)
    v[k+(cfg,'machine')].append(1000*x['cpu']['machine_ms']/t)
print('| cell | µs a transaction (median of rounds) | passthrough | A | B |')
print('|---|---|---:|---:|---:|')
for k in sorted({k[:2] for k in v}):
  for what in ('daemon','fuse','machine'):
    r=[v.get(k+(c,what)) for c in ('pass','a','b')]
    print(f"| {k[0]} {k[1]} | {what} | "+' | '.join(f"{st.median(x):.0f}" if x else '–' for x in r)+' |')
