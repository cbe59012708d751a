import json,glob,sys,statistics as st
out=sys.argv[1]
r={'passt':[[],[]],'farca':[[],[]]}
rat=[[],[]]
for f in sorted(glob.glob(out+'/*/paper-raw.json'), key=lambda x:int(x.split('/')[-2])):
  d=json.load(open(f)); t={}
  for run in d['runs']:
    t[run['config'][:5]]=[p['secs'] for p in run['passes']]
  for c in t:
    for k in (0,1): r[c][k].append(t[c][k])
  if len(t)==2:
    for k in (0,1): rat[k].append(t['passt'][k]/t['farca'][k])
  print(f.split('/')[-2], {c:[round(x,3) for x in v] for c,v in t.items()}, [round(t['passt'][k]/t['farca'][k],2) for k in (0,1)] if len(t)==2 else '')
for k in (0,1):
  print('pass',k+1,'median passt',round(st.median(r['passt'][k]),3),'farca',round(st.median(r['farca'][k]),3),'median ratio',round(st.median(rat[k]),3), 'n',len(rat[k]))
cpu={'passt':[[],[]],'farca':[[],[]]}
for f in glob.glob(out+'/*/paper-raw.json'):
  d=json.load(open(f))
  for run in d['runs']:
    for k,p in enumerate(run['passes']):
      if p.get('daemon_cpu_ms') is not None: cpu[run['config'][:5]][k].append(p['daemon_cpu_ms'])
for k in (0,1):
  if cpu['passt'][k]: print('daemon cpu ms pass',k+1,{c:(round(st.median(v[k])),min(v[k]),max(v[k])) for c,v in cpu.items()})
