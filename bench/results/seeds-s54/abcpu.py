import json,glob,sys,statistics as st,collections
out=sys.argv[1]
cpu=collections.defaultdict(list); secs=collections.defaultdict(list); tx=collections.defaultdict(list)
for f in glob.glob(out+'/*/*/paper-*.json'):
  cfg=f.split('/')[-2].split('-',1)[1]
  d=json.load(open(f))
  for run in d['runs']:
    sz=run['size_bytes']>>20
    for p in run['passes']:
      k=(sz,p['pass'],cfg)
      if p.get('daemon_cpu_ms') is not None: cpu[k].append(p['daemon_cpu_ms'])
      secs[k].append(p['secs'])
    if run.get('transfers'): tx[(sz,cfg)].append(run['transfers']['bytes_to_servers']/2**20)
print('| size, pass | daemon CPU ms: passthrough / A / B (median of n) | B − A | pass s: passthrough / A / B (median) |')
print('|---|---|---:|---|')
for sz in sorted({k[0] for k in cpu}):
  for ps in (1,2):
    m={c:st.median(cpu[(sz,ps,c)]) for c in ('pass','a','b') if cpu[(sz,ps,c)]}
    s={c:st.median(secs[(sz,ps,c)]) for c in ('pass','a','b')}
    print(f"| {sz} MiB pass {ps} | {m['pass']:.0f} / {m['a']:.0f} / {m['b']:.0f} (n={len(cpu[(sz,ps,'a')])}) | {m['b']-m['a']:+.0f} | {s['pass']:.3f} / {s['a']:.3f} / {s['b']:.3f} |")
for sz in sorted({k[0] for k in tx}):
  print(sz,'MiB to lenders (both passes) A',st.median(tx[(sz,'a')]),'B',st.median(tx[(sz,'b')]))
