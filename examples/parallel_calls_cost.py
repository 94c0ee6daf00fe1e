"""What predicting a turn's later calls costs the sidecar: Qwen2.5-Coder-0.5B (the default sidecar) on BFCL
parallel requests with two expected calls.

Per request, after one cold prediction (the prompt encoded), warm predictions alternate between the first
call only (max_calls 1) and the whole turn (max_calls 4); then the two parts of a later call are timed alone:
deciding what follows the first call (`next_call_opening`) and guessing the second call given the hermes
joint. Model forwards are counted as well as seconds (wall times on a shared CPU vary; forwards do not).

    PYTHONPATH=. python examples/parallel_calls_cost.py [ADAPTER|none] [N_REQUESTS] [THREADS]
"""

import json
import statistics
import sys
import time

import torch

from oospec.datasets import load_dataset
from oospec.sidecar.predictor import SidecarPredictor
from oospec.sidecar.protocol import Job, parse_payload
from oospec.tools.schema import to_openai

HERMES_JOINT = "\n</tool_call>\n<tool_call>\n"

adapter = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "none" else None
n_requests = int(sys.argv[2]) if len(sys.argv) > 2 else 4
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
# A first call is always guessed (min_call_probability 0): the cost of the calls after it is the question.
pred = SidecarPredictor.from_pretrained("qwen2.5-coder-0.5b", adapter=adapter, min_call_probability=0.0)
forwards = [0]
forward = pred.model.forward
pred.model.forward = lambda *a, **k: (forwards.__setitem__(0, forwards[0] + 1), forward(*a, **k))[1]


def timed(fn):
    forwards[0] = 0
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, forwards[0]


rows = []
for s in [s for s in load_dataset("bfcl", split="parallel") if len(s.gold) == 2][:n_requests]:
    tools = [to_openai(t) for t in s.tools]
    job = Job(s.id, s.messages, tools, s.chat_tools(), "<tool_call>\n", "arguments", openers=["<tool_call>\n"])
    pred.clear_cache()
    row = {"id": s.id}
    for label, max_calls in [("cold", 1), ("first", 1), ("turn", 4), ("first", 1), ("turn", 4)]:
        pred.max_calls = max_calls
        raw, secs, fw = timed(lambda: pred.predict(job))
        row.setdefault(label + "_s", []).append(round(secs, 3))
        row[label + "_forwards"] = fw
        row[label + "_calls"] = len(parse_payload(raw, s.id, s.tools).calls)
    best = pred.guess(job, s.tools)[0]
    text = pred.format.prompt(job) + pred.format.call_text(job, best.function, best.arguments)
    joint, row["opening_s"], row["opening_forwards"] = timed(lambda: pred.next_call_opening(text))
    row["opening"] = joint
    second_job = pred.format.after_calls(job, pred.format.call_text(job, best.function, best.arguments) + HERMES_JOINT)
    second, row["second_s"], row["second_forwards"] = timed(lambda: pred.guess(second_job, s.tools, later=True)[0])
    row["second_call"] = [second.function, second.arguments]
    row["gold"] = [[c.name, c.arguments] for c in s.gold]
    rows.append(row)
    print(json.dumps(row, ensure_ascii=False), flush=True)

med = lambda key: statistics.median(x for r in rows for x in (r[key] if isinstance(r[key], list) else [r[key]]))  # noqa: E731
print(json.dumps({"adapter": adapter, "requests": len(rows), "threads": torch.get_num_threads(),
                  **{f"median_{k}": round(med(k), 3) for k in ("cold_s", "first_s", "turn_s", "opening_s", "second_s")},
                  **{f"median_{k}": med(k) for k in ("first_forwards", "turn_forwards", "opening_forwards",
                                                     "second_forwards")},
                  "turns_with_2_calls": sum(r["turn_calls"] >= 2 for r in rows)}))
