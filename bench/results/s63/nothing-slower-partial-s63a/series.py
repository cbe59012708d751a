import json,sys
pidsel=int(sys.argv[2])
for l in open(sys.argv[1]):
    try: d=json.loads(l)
    except Exception: continue
    s=d['stats']
    if s['pid']!=pidsel: continue
    e=s['engine']; r=s['routing'].get('adaptive') or {}
    lo,hi=float(sys.argv[3]),float(sys.argv[4])
    if not lo<=s['uptime_secs']<=hi: continue
    print('%4d'%s['uptime_secs'],'fills',e['fills'],'disk',e['adaptive_disk'],'rem',e['adaptive_remote'],'pr',e['adaptive_probes'],'share %.3f'%r['disk_share'],'d/r %.2f'%r['disk_over_remote'],'hit %.0f'%r['remote_hit_us'],'dwin %.0f'%r['disk_window_mean_us'],'held %.2f'%r['lenders_held'],'miss %.0f'%r['lender_miss_us'],'surv %.2f'%r['fills_surviving'],'q',r['probe_backoff'], 'cls', [ (int(c[0]),int(c[1]),int(c[3])) for c in r['classes'][:3]])
