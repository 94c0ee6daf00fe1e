"""The sidecar's call probability on the validation and test traces, for the job a drafter sends on the first
request of its dialect (the dialect's opener and openers, not the teacher's: nothing learned yet), under the
rule before 2026-12-02 (only the job's openers scored) and the rule now (every known wrapper, CALL_OPENERS).

    .venv/bin/python results/sidecar-v3-eval/first_request_probe.py > results/sidecar-v3-eval/first-request.jsonl
"""
import gzip
import json
from dataclasses import replace

import numpy as np
import torch

from oospec.sidecar.predictor import SidecarPredictor
from oospec.tools.dialects import DIALECTS
from oospec.training.rows import job_for

ADAPTER = "oospec/sidecar/adapters/qwen2.5-coder-0.5b-toolcalls-v3"

torch.set_num_threads(2)
manifest = json.load(open(f"{ADAPTER}/data_manifest.json"))
traces = {t["id"]: t for t in map(json.loads, gzip.open(f"{ADAPTER}/traces.jsonl.gz", "rt"))}
predictor = SidecarPredictor.from_pretrained("qwen2.5-coder-0.5b", adapter=ADAPTER, dtype="float32")
for part in ("validation", "test"):
    for item in manifest["items"][part]:
        trace = traces[item]
        dialect = DIALECTS[trace["dialect"]]
        job = replace(job_for(trace), opener=dialect.opener, openers=list(dialect.openers))
        prompt = predictor.format.prompt(job)
        rows = [predictor.format.encode(prompt + predictor.format.function_prefix(replace(job, opener=o)))
                for o in dict.fromkeys([job.opener, *job.openers])]
        _, logprobs = predictor.score_rows(rows, share_with=[predictor.format.encode(prompt)])
        before = float(min(1.0, sum(np.exp(lp.sum()) for lp in logprobs)))
        print(json.dumps({"part": part, "id": item, "source": trace.get("dataset"), "teacher_called": bool(trace.get("call")),
                          "dialect": dialect.name, "before": round(before, 4),
                          "now": round(predictor.call_likelihood(job, prompt), 4)}), flush=True)
