"""Generate a dataset's chats in real vLLM with one speculation setting; write ids and timings as JSON.

    python -m oospec.integrations.vllm.run --setting none|ngram|suffix|oospec|oospec-sidecar|oracle \
        --model <folder> --dataset apibank:1 --limit 20 --out run.json

`--setting custom --proposer MODULE.CLASS` runs any other proposer class vLLM's worker can import (the tests'
hostile one: tests/vllm/random_proposer.py, with that folder on PYTHONPATH).

One setting per process: vLLM's engine is only fully torn down with its process (vLLM spawns it, so this
module keeps `LLM(...)` under `if __name__ == "__main__"`). Used by `oospec bench vllm` (bench.py) and by
the real-vLLM equivalence tests (tests/vllm/real_vllm.py). Even-numbered chats carry their context in
`extra_args` (the route of `vllm_xargs` and LLM.generate users), odd ones leave the proposer to read the
tools from the rendered prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from oospec.integrations.vllm.context import EXTRA_ARGS_KEY
from oospec.models.registry import DEFAULT_MAX_NEW_TOKENS

PROPOSERS = "oospec.integrations.vllm"
SETTINGS = {  # name -> (speculative method, custom class, extra environment of vLLM's worker)
    "none": (None, None, {}),
    "ngram": ("ngram", None, {}),
    "suffix": ("suffix", None, {}),  # needs arctic-inference (`make vllm-suffix` builds it from its sdist)
    "oospec": ("custom_class", f"{PROPOSERS}.proposer.OospecProposer", {}),
    "oospec-sidecar": ("custom_class", f"{PROPOSERS}.proposer.OospecProposer", {"OOSPEC_VLLM_SIDECAR": "1"}),
    "oracle": ("custom_class", f"{PROPOSERS}.oracle.OracleProposer", {}),
}
CUSTOM = "custom"  # a proposer class named by --proposer: not one of oospec's settings, so not in `oospec bench vllm`


def load_chats(datasets: list[str], limit: int, offset: int = 0):
    """`limit` chats of each dataset after its first `offset` (the bench's fresh items: past those used in
    development)."""
    from oospec.datasets.loader import load_dataset
    from oospec.tools.schema import to_openai

    out = []
    for name in datasets:
        for s in load_dataset(name, limit=offset + limit)[offset:]:
            context = {"tools": [to_openai(t) for t in s.tools], "messages": s.messages, "dialect": s.dialect}
            out.append((s, context if len(out) % 2 == 0 else None))
    return out


def speculative_config(setting: str, k: int, proposer: str | None = None) -> dict | None:
    method, cls, _ = ("custom_class", proposer, {}) if setting == CUSTOM else SETTINGS[setting]
    if method is None:
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if method == "suffix":  # vLLM's defaults otherwise (tree depth 24, min token probability 0.1)
        return {"method": "suffix", "num_speculative_tokens": k}
    return {"method": method, "model": cls, "num_speculative_tokens": k}


def run_identity(args) -> dict:
    """What makes two runs of one setting the same run: `oospec bench vllm --resume` reuses a file only if
    this matches."""
    custom = {"proposer": args.proposer} if getattr(args, "proposer", None) else {}  # old run files lack the key
    return {"setting": args.setting, **custom, "model": str(args.model), "dtype": args.dtype, "k": args.k,
            "concurrency": args.concurrency, "datasets": list(args.dataset or ["apibank:1"]), "limit": args.limit,
            "offset": args.offset, "max_tokens": args.max_new_tokens, "enforce_eager": bool(args.enforce_eager)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", choices=[*SETTINGS, CUSTOM], required=True)
    ap.add_argument("--proposer", help="MODULE.CLASS of the proposer for --setting custom")
    ap.add_argument("--model", required=True, help="a Hugging Face folder (`oospec models pull`)")
    ap.add_argument("--dataset", action="append", default=None, help="repeatable; default apibank:1")
    ap.add_argument("--limit", type=int, default=20, help="chats per dataset")
    ap.add_argument("--offset", type=int, default=0, help="skip the first N chats of each dataset")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    ap.add_argument("--max-new-tokens", "--max-tokens", dest="max_new_tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--enforce-eager", action="store_true",
                    help="no torch.compile (minutes less start-up; checks of equivalence, not of speed)")
    ap.add_argument("--reference", help="the `none` setting's output JSON: the oracle proposes its tokens")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    if (args.setting == CUSTOM) != bool(args.proposer):
        ap.error("--proposer goes with --setting custom, and --setting custom needs --proposer MODULE.CLASS")
    os.environ.update(SETTINGS.get(args.setting, (None, None, {}))[2])
    if args.setting == "oracle":
        if not args.reference:
            ap.error("--setting oracle needs --reference (the `none` setting's output)")
        os.environ["OOSPEC_VLLM_ORACLE"] = str(Path(args.reference).resolve())

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = speculative_config(args.setting, args.k, args.proposer)
    # Per-request acceptance counts (tau) exist only with speculation; vLLM refuses the option without it.
    spec_metrics = {"per_request_spec_decode_metrics": "summary"} if spec else {}
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0, speculative_config=spec,
              enable_prefix_caching=False, disable_log_stats=False, enforce_eager=args.enforce_eager, **spec_metrics)
    tok = llm.get_tokenizer()
    chats = load_chats(args.dataset or ["apibank:1"], args.limit, args.offset)
    prompts, params, ids, datasets = [], [], [], []
    for sample, context in chats:
        prompts.append(TokensPrompt(prompt_token_ids=tok.encode(sample.prompt_text(tok), add_special_tokens=False)))
        extra = {EXTRA_ARGS_KEY: context} if context is not None else None
        params.append(SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens, extra_args=extra))
        ids.append(sample.id)
        datasets.append(sample.dataset)
    llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = []
    for start in range(0, len(prompts), args.concurrency):
        outs.extend(llm.generate(prompts[start:start + args.concurrency], params[start:start + args.concurrency],
                                 use_tqdm=False))
    wall_s = time.perf_counter() - t0
    items = {}
    for item_id, dataset, prompt, out in zip(ids, datasets, prompts, outs):
        m, comp = out.metrics, out.outputs[0]
        spec = getattr(comp, "spec_decode_metrics", None)
        hist = list(getattr(spec, "histogram", []) or [])
        steps = sum(hist)
        items[item_id] = {
            "dataset": dataset, "prompt_ids": list(prompt["prompt_token_ids"]), "tokens": list(comp.token_ids),
            "text": comp.text,
            "e2e_s": (m.last_token_ts - m.scheduled_ts) if m else None,
            "ttft_s": (m.first_token_ts - m.scheduled_ts) if m else None,
            "decode_s": (m.last_token_ts - m.first_token_ts) if m else None,
            "tau": 1 + sum(j * h for j, h in enumerate(hist)) / steps if steps else 1.0,
        }
    Path(args.out).write_text(json.dumps({**run_identity(args), "wall_s": wall_s, "items": items}))
    print(f"{args.setting}: {len(outs)} chats in {wall_s:.1f} s")


if __name__ == "__main__":
    main()
