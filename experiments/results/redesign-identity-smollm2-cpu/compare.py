import json, sys
def load(p):
    out={}
    for l in open(p):
        r=json.loads(l); out[(r['dataset'],r['sample_id'],r['method'])]=r
    return out
base=load('before-samples.jsonl'); base2=load('before-2threads-samples.jsonl'); new=load('after-samples.jsonl')
def tokens(r): return r.get('text')
rows=[]; bad=0
for k,r in new.items():
    d,s,m=k
    if m=='ar-target-threads':
        ref=base.get((d,s,'ar')); src='base ar (1 thread)'
    elif m in ('sidecar','oospec','oospec-wait'):
        ref=base.get(k); src='base (target 1 thread)'
    else:
        ref=base2.get(k); src='base2 (2 threads)'
        if m=='ar-all-cores': ref=base.get(k); src='base'
    if ref is None: print('missing',k); continue
    same_text = r['text']==ref['text']; same_fw = r['target_forwards']==ref['target_forwards']; same_n=r['new_tokens']==ref['new_tokens'] and (r['accepted_per_step']==ref['accepted_per_step'] or m in ('oospec', 'sidecar'))
    ok = same_text and same_n and (same_fw or m in ('oospec', 'sidecar'))
    if not ok: bad+=1
    print(f"{d:14s} {s:22s} {m:18s} text={'=' if same_text else 'DIFF'} new={r['new_tokens']}/{ref['new_tokens']} fw={r['target_forwards']}/{ref['target_forwards']} ident={r['identical']} [{src}]")
print('records', len(new), 'mismatches', bad)
