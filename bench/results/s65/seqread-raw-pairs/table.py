import json,glob,os,statistics as st,math,sys
sys.path.insert(0,'/work/main/scripts')
import importlib.util
spec=importlib.util.spec_from_file_location('t','/work/main/scripts/nothing-slower-table.py'); t=importlib.util.module_from_spec(spec); spec.loader.exec_module(t)
res={}
for d in sorted(glob.glob('/tmp/s65/ab2/*[0-9]')):
    rule=os.path.basename(d).rstrip('0123456789')
    try: doc=json.load(open(d+'/paper-raw.json'))
    except OSError: continue
    runs={r['config']:r for r in doc['runs']}
    for i in (0,1):
        res.setdefault((rule,i+1),[]).append(runs['passthrough']['passes'][i]['secs']/runs['farcache']['passes'][i]['secs'])
for (rule,p),v in sorted(res.items()):
    b,a=sum(x<1 for x in v),sum(x>1 for x in v)
    print(f"{rule:9} pass {p}: n {len(v)} median {st.median(v):.3f} geomean {math.exp(sum(map(math.log,v))/len(v)):.3f} below/above {b}/{a} p {t.sign_test(b,a):.2f}  ", ' '.join(f'{x:.2f}' for x in v))
