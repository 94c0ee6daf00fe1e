import json, sys, torch
from oospec.sidecar.predictor import SidecarPredictor
from oospec.training.evaluate import agreement, format_report
torch.set_num_threads(2)
traces = [json.loads(l) for l in open(sys.argv[1])]
order = sys.argv[2]
p = SidecarPredictor.from_pretrained("qwen2.5-coder-0.5b", adapter="oospec/sidecar/adapters/qwen2.5-coder-0.5b-toolcalls-v3", slot_order=order)
fw = []
orig = p.predict
def predict(job):
    out = orig(job); fw.append(p.in_order_forwards); return out
p.predict = predict
r = agreement(p, traces, progress=False)
r["in_order_forwards"] = fw
json.dump(r, open(sys.argv[3], "w"), indent=1)
print(format_report({order: r}).split("### Calibration")[0]); print("forwards", fw)
