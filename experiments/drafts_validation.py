"""Tau and decode time of toolspec and oospec's drafts (no sidecar process) on validation items: the items the
sidecar's training used (its manifest), never the held-out test items of the README. What the drafting changes of
2026-12-04 were chosen on; every reply is checked identical to the first method's.

    python experiments/drafts_validation.py --dataset apibank:1 --limit 14
    python experiments/drafts_validation.py --dataset bfcl --limit 10 --probe-nodes 16 [--flat]

--probe-nodes N forces N slot-probe rows per forward (oospec.drafters.slots; by default the cost curve decides,
which on CPU is 0); --flat verifies as if rows were free (an accelerator's curve: tau only, not time).
"""

from __future__ import annotations

import argparse
import glob

from oospec.bench.items import trained_item_filter
from oospec.datasets import load_dataset
from oospec.drafters import make_drafter
from oospec.drafters.sidecar import OoOSpecDrafter
from oospec.drafters.slots import SlotDrafter
from oospec.engine.budget import CostModel
from oospec.engine.engine import Engine


class ForcedProbes(SlotDrafter):
    def __init__(self, schema, nodes: int):
        super().__init__(schema, nodes)
        self.forced = nodes

    def start(self, request) -> None:
        super().start(request)
        self.probe_nodes = self.forced


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="apibank:1")
    ap.add_argument("--limit", type=int, default=14)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--probe-nodes", type=int, default=0)
    ap.add_argument("--flat", action="store_true")
    args = ap.parse_args()
    engine = Engine.from_pretrained("qwen2.5-coder-1.5b", dtype="auto")
    used = trained_item_filter(glob.glob("oospec/sidecar/adapters/*toolcalls-v3")[0])
    samples = [s for s in load_dataset(args.dataset) if used(s)][args.offset:][: args.limit]
    methods = {"toolspec": make_drafter("toolspec")}
    if args.probe_nodes:
        oospec = OoOSpecDrafter(max_probe_nodes=0)
        oospec.parts.insert(2, ForcedProbes(oospec.parts[0], args.probe_nodes))
        methods[f"oospec, {args.probe_nodes} probe rows"] = oospec
    cost = CostModel.flat() if args.flat else None
    totals = {m: [0, 0, 0.0] for m in methods}
    for sample in samples:
        prompt = engine.encode(sample.messages, sample.chat_tools())
        first = None
        for name, drafter in methods.items():
            request = sample.request(prompt_ids=prompt, max_new_tokens=128, budget=16, cost=cost)
            result = engine.generate(request, drafter=drafter)
            first = result.tokens.tolist() if first is None else first
            assert result.tokens.tolist() == first, (sample.id, name)
            t = totals[name]
            t[0] += result.stats.new_tokens
            t[1] += result.stats.target_forwards
            t[2] += result.stats.decode_s
    print(f"{args.dataset}, {len(samples)} validation items, {'flat curve' if args.flat else 'measured curve'}:")
    for name, (tokens, forwards, decode_s) in totals.items():
        print(f"  {name}: tau {tokens / forwards:.2f}, decode {decode_s:.1f} s, 100% identical")


if __name__ == "__main__":
    main()
