"""Issue 32's check at scale: every row of a k-row verification forward bitwise equal to its 1-row forward (hidden
states after every layer and logits), over many random prompts and token trees, for one model and dtype.

    python experiments/invariance_probe.py --model qwen2.5-coder-1.5b --dtype bfloat16 --trees 100

Tree sizes cycle through 1..16 nodes (k = 2..17 rows), each tree on a fresh random prompt of 16-64 tokens.
Prints one JSON line: model, dtype, kernels, trees, rows compared, the first difference (or none), seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from oospec.engine.precision import load_target, probe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, _, _ = load_target(args.model, dtype=args.dtype)
    rng = np.random.default_rng(0)
    start, rows, first_difference = time.time(), 0, None
    for i in range(args.trees):
        result = probe(model, trees=(1 + i % 16,), prompt_len=int(rng.integers(16, 65)), seed=i)
        rows += int(result.detail.split()[0]) if result.invariant else 0
        if not result.invariant:
            first_difference = f"tree {i}: {result.detail}"
            break
    print(json.dumps({"model": args.model, "dtype": args.dtype, "kernels": model.oospec_invariant["kernels"],
                      "trees": args.trees, "rows_compared": rows, "first_difference": first_difference,
                      "seconds": round(time.time() - start, 1)}))


if __name__ == "__main__":
    main()
