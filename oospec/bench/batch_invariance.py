"""Does a k-token verification forward rank tokens exactly as 1-token forwards do? (batch invariance)

    python -m oospec.bench.batch_invariance --model smollm2-135m --dtype bfloat16 --prompts 20 --k 8

Speculative greedy decoding is lossless only if the target's choice after a token is the same whether that
token was verified alone or inside a k-token forward. Each prompt is decoded greedily with 1-token forwards
(plain greedy: the reference); then, from the same prefill, the reference tokens are verified as chains of
k tokens, and each row's argmax is compared with the reference token at that position. An argmax that
differs is a position where speculative decoding would change the output. Reported: the identical rate
(positions and prompts), the max |logit difference| between the two, and where any argmax differed, the
logit gap of the reference's top two there (a near-tie is rounding; a wide gap would be a bug).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree


def one_token_greedy(target: TargetBackend, prompt: np.ndarray, n: int) -> tuple[np.ndarray, torch.Tensor]:
    """Plain greedy: (n,) tokens and the (n, vocab) float32 logits each came from (row 0 after the prompt)."""
    target.reset(prompt.size + n + 1)
    rows = [target.prefill_logits(prompt).float()]
    tokens = [int(rows[0].argmax())]
    for _ in range(n - 1):
        rows.append(target.verify_logits(tokens[-1], TokenTree.empty())[0].float())
        target.commit(np.empty(0, dtype=np.int64))
        tokens.append(int(rows[-1].argmax()))
    return np.asarray(tokens, dtype=np.int64), torch.stack(rows)


def chained(target: TargetBackend, prompt: np.ndarray, tokens: np.ndarray, k: int) -> torch.Tensor:
    """The same positions verified k at a time: the pending token plus a chain of the next k-1 reference tokens
    per forward, all accepted. Returns the (n, vocab) float32 logits, row 0 from the prefill."""
    n = tokens.size
    target.reset(prompt.size + n + k + 1)
    rows = [target.prefill_logits(prompt).float()[None]]
    i = 0  # tokens[i] is pending
    while i < n - 1:
        chain = tokens[i + 1 : min(i + k, n - 1)]
        out = target.verify_logits(int(tokens[i]), TokenTree.chain(chain)).float()
        target.commit(np.arange(chain.size))
        rows.append(out)
        i += chain.size + 1
    return torch.cat(rows)[:n]


def probe(model, prompts: list[np.ndarray], new_tokens: int, ks: list[int]) -> list[dict]:
    target = TargetBackend(model)
    acc = {k: {"k": k, "positions": 0, "identical_positions": 0, "identical_prompts": 0, "max_abs_logit_diff": 0.0,
               "breaks": []} for k in ks}
    for p, prompt in enumerate(prompts):
        tokens, ref = one_token_greedy(target, prompt, new_tokens)
        for k, a in acc.items():
            got = chained(target, prompt, tokens, k)
            same = got.argmax(-1).numpy() == tokens
            a["identical_positions"] += int(same.sum())
            a["positions"] += same.size
            a["identical_prompts"] += bool(same.all())
            a["max_abs_logit_diff"] = max(a["max_abs_logit_diff"], float((got - ref).abs().max()))
            for pos in np.flatnonzero(~same)[:3]:
                top2 = ref[pos].topk(2).values
                a["breaks"].append({"prompt": p, "position": int(pos), "gap_top2": float(top2[0] - top2[1]),
                                    "diff_here": float((got[pos] - ref[pos]).abs().max())})
    for a in acc.values():
        a["prompts"], a["new_tokens"] = len(prompts), new_tokens
        a["identical_rate"] = a["identical_positions"] / a["positions"] if a["positions"] else 0.0
    return list(acc.values())


def chat_prompts(tokenizer, n: int) -> list[np.ndarray]:
    """API-Bank level-1 requests rendered with their tools, as the benchmark gives them to the target."""
    from oospec.datasets import load_dataset

    out = []
    for sample in load_dataset("apibank", split="1", limit=n):
        ids = tokenizer.apply_chat_template(sample.messages, tools=sample.chat_tools() or None,
                                            add_generation_prompt=True, tokenize=True, return_dict=False)
        out.append(np.asarray(ids["input_ids"] if hasattr(ids, "keys") else ids, dtype=np.int64).reshape(-1))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--k", default="4,8,16", help="chain lengths, comma separated")
    ap.add_argument("--optimize", action="store_true", help="the float32 CPU kernels (oospec.engine.cpu_kernels)")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from oospec.models.loading import load_model

    model, tokenizer = load_model(args.model, dtype=args.dtype)
    if args.optimize:
        from oospec.engine.cpu_kernels import optimize_for_cpu

        optimize_for_cpu(model)
    prompts = chat_prompts(tokenizer, args.prompts)
    with torch.inference_mode():
        results = probe(model, prompts, args.new_tokens, [int(k) for k in args.k.split(",")])
    print(json.dumps({"model": args.model, "dtype": args.dtype, "optimize": args.optimize,
                      "threads": torch.get_num_threads(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
