"""Tau and decode time of toolspec's and oospec's drafts (no sidecar process) on validation items: items the
sidecar's training used (its manifest; `oospec bench run --held-out-only` leaves exactly these out), never the
held-out test items of the README. What the drafting changes of 2026-12-04 were chosen on; every reply is
checked identical to the first method's.

    python experiments/drafts_validation.py --dataset apibank:1
    python experiments/drafts_validation.py --dataset bfcl
    python experiments/drafts_validation.py --dataset bfcl --fresh-drafter   # as a one-shot process drafts
    python experiments/drafts_validation.py --dataset apibank:1 --wide       # the first 40 training items

One drafter serves the items in order by default, as in `oospec bench run` and a server (its habits, the
target's openers, closers and whitespace, are learned from the first reply); `--fresh-drafter` starts a new one
for every item, as a one-shot `oospec generate` does.
"""

from __future__ import annotations

import argparse

import oospec
from oospec.datasets import load_dataset
from oospec.drafters import make_drafter

# The first training items of each set, in file order (API-Bank level 1: 14, BFCL simple_python: 10).
VALIDATION_ITEMS = {
    "apibank:1": [f"apibank-l1-{i}" for i in (8, 9, 10, 14, 15, 16, 18, 19, 20, 21, 22, 23, 24, 25)],
    "bfcl": [f"simple_python_{i}" for i in (34, 35, 38, 49, 59, 62, 63, 67, 72, 73)],
}
# --wide: the first 40 training items of each (the ones above first), in file order.
VALIDATION_WIDE = {
    "apibank:1": VALIDATION_ITEMS["apibank:1"] + [f"apibank-l1-{i}" for i in (
        29, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 45, 46, 47, 48, 49, 51, 52, 53, 54, 56, 57, 58, 59)],
    "bfcl": VALIDATION_ITEMS["bfcl"] + [f"simple_python_{i}" for i in (
        84, 88, 94, 104, 107, 113, 117, 130, 134, 136, 138, 142, 143, 148, 149, 156, 157, 174, 184, 185, 188, 192,
        195, 205, 211, 212, 213, 214, 220, 221)],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="apibank:1", choices=sorted(VALIDATION_ITEMS))
    ap.add_argument("--fresh-drafter", action="store_true", help="a new drafter for every item (nothing learned)")
    ap.add_argument("--wide", action="store_true", help="the first 40 training items instead of the first 10-14")
    args = ap.parse_args()
    engine = oospec.Engine.from_pretrained("qwen2.5-coder-1.5b", dtype="auto")
    wanted = (VALIDATION_WIDE if args.wide else VALIDATION_ITEMS)[args.dataset]
    samples = sorted((s for s in load_dataset(args.dataset) if s.id in wanted), key=lambda s: wanted.index(s.id))
    methods = {"toolspec": make_drafter("toolspec"), "oospec (no sidecar process)": make_drafter("oospec")}
    totals = {m: [0, 0, 0.0] for m in methods}
    for sample in samples:
        prompt = engine.encode(sample.messages, sample.chat_tools())
        first = None
        for name, drafter in methods.items():
            if args.fresh_drafter:
                drafter = make_drafter(name.split()[0])
            request = sample.request(prompt_ids=prompt, max_new_tokens=128, budget=16)
            result = engine.generate(request, drafter=drafter)
            first = result.tokens.tolist() if first is None else first
            assert result.tokens.tolist() == first, (sample.id, name)
            t = totals[name]
            t[0] += result.stats.new_tokens
            t[1] += result.stats.target_forwards
            t[2] += result.stats.decode_s
    print(f"{args.dataset}, {len(samples)} validation items:")
    for name, (tokens, forwards, decode_s) in totals.items():
        print(f"  {name}: tau {tokens / forwards:.2f}, decode {decode_s:.1f} s, 100% identical")


if __name__ == "__main__":
    main()
