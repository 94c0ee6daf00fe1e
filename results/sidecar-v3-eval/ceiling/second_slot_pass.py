"""Experiment (issue 14, not shipped): a second slot pass that conditions each slot on the sidecar's own values of
the slots before it, in schema order. Usage: second_slot_pass.py TRACES[,TRACES] off,seq OUT.json"""
import json, sys
from oospec.sidecar.predictor import SidecarPredictor, TaskFormat, closed_options
from oospec.sidecar.protocol import Guess
from oospec.training.evaluate import agreement, format_report
from oospec.training.traces import read_traces
import torch

class Seq(TaskFormat):
    def __init__(self, base):
        super().__init__(base.tokenizer); self.before = {}
    def slot_prefix(self, job, function, param):
        # TaskFormat's own row, with the earlier slots' text put in after the arguments' opening brace.
        row = super().slot_prefix(job, function, param)
        at = row.index("{", len(self.function_prefix(job) + function)) + 1
        return row[:at] + self.before.get((function, param.name), "") + row[at:]

class SeqPredictor(SidecarPredictor):
    mode = "seq"
    def fill_slots(self, job, prompt, chosen):
        guesses = super().fill_slots(job, prompt, chosen)
        if self.mode == "off":
            return guesses
        fmt0 = self.format
        seq = Seq(fmt0)
        first = {g.function: g.arguments for g in guesses}
        todo = []
        for tool, _ in chosen:
            args = first.get(tool.name, {})
            text = ""
            for p in tool.parameters:
                if text:
                    seq.before[(tool.name, p.name)] = text
                    todo.append((tool, p))
                if p.name in args:
                    text += json.dumps(p.name) + ": " + json.dumps(args[p.name], ensure_ascii=False) + ", "
        if not todo:
            return guesses
        self.format = seq
        try:
            closed = [(t, p) for t, p in todo if closed_options(p)]
            free = [(t, p) for t, p in todo if not closed_options(p)]
            values = {**self.decode_free(job, prompt, free), **self.choose_closed(job, prompt, closed)}
        finally:
            self.format = fmt0
        out = []
        for g, (tool, score) in zip(guesses, chosen):
            args = dict(g.arguments)
            for t, p in todo:
                if t.name != tool.name: continue
                if (t.name, p.name) in values: args[p.name] = values[(t.name, p.name)]
                else: args.pop(p.name, None)
            out.append(Guess(g.function, {p.name: args[p.name] for p in tool.parameters if p.name in args}, g.score))
        return out

torch.set_num_threads(2)
adapter = "oospec/sidecar/adapters/qwen2.5-coder-0.5b-toolcalls-v3"
res = {}
pred = SeqPredictor.from_pretrained("qwen2.5-coder-0.5b", adapter=adapter)
for mode in sys.argv[2].split(","):
    SeqPredictor.mode = mode
    for path in sys.argv[1].split(","):
        traces = read_traces(path)
        pred.clear_cache()
        res[f"{mode} {path}"] = agreement(pred, traces)
print(format_report(res))
json.dump(res, open(sys.argv[3], "w"), indent=1)
