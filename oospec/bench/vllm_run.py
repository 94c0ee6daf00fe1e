"""One setting of `oospec bench vllm` in this process: the selected chats generated in real vLLM with one
speculation setting, ids, tokens and timings written as JSON.

    oospec bench vllm --setting none|ngram|suffix|oospec|oospec-sidecar|oracle --model <folder> \
        --dataset apibank:1 --limit 20 --out run.json

`--setting custom --proposer MODULE.CLASS` runs any other proposer class vLLM's worker can import (the tests'
hostile one: tests/vllm/random_proposer.py, with that folder on PYTHONPATH).

One setting per process: vLLM's engine is only fully torn down with its process, so `bench vllm` (vllm.py)
starts `python -m oospec bench vllm --setting ...` once per setting, with the same options it was given (one
parser: oospec.cli.bench). The real-vLLM equivalence tests (tests/vllm/real_vllm.py) start it too. vLLM
spawns its engine process; a spawned child does not rerun `python -m oospec`'s __main__ (multiprocessing
skips a package's __main__), nor the `oospec` script (its main is guarded). Even-numbered chats carry their
context in `extra_args` (the route of `vllm_xargs` and LLM.generate users), odd ones leave the proposer to
read the tools from the rendered prompt.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from oospec.bench.items import BenchError, select

PROPOSERS = "oospec.integrations.vllm"
SETTINGS = {  # name -> (speculative method, custom class, extra environment of vLLM's worker)
    "none": (None, None, {}),
    "ngram": ("ngram", None, {}),
    "suffix": ("suffix", None, {}),  # needs arctic-inference (`make vllm-suffix` builds it from its sdist)
    "oospec": ("custom_class", f"{PROPOSERS}.proposer.OospecProposer", {}),
    "oospec-sidecar": ("custom_class", f"{PROPOSERS}.proposer.OospecProposer", {"OOSPEC_VLLM_SIDECAR": "1"}),
    "oracle": ("custom_class", f"{PROPOSERS}.oracle.OracleProposer", {}),
}
SIDECAR_SETTING = "oospec-sidecar"  # the setting that starts the sidecar (its items are checked)
DEFAULT_SETTINGS = "none,ngram,oospec,oospec-sidecar,oracle"  # `bench vllm --settings`
CUSTOM = "custom"  # a proposer class named by --proposer: not one of oospec's settings, so not in a bench's list


def sidecar_adapter() -> str | None:
    """The adapter of the sidecar the oospec-sidecar setting starts (the proposer's default: the shipped one)."""
    from oospec.sidecar.process import SidecarSettings, resolve_adapter

    sidecar = SidecarSettings()
    return resolve_adapter(sidecar.model, sidecar.adapter)


def load_chats(selection, adapter: str | None = None) -> list:
    """[(sample, context or None)]: the items `selection` (oospec.bench.items.Selection) picks, checked against
    the sidecar `adapter` as every benchmark checks its items (None: no sidecar runs, nothing to check)."""
    from oospec.tools.schema import to_openai

    out = []
    for _, samples in select(selection, adapter)[0]:
        for s in samples:
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
    this matches. Keys of options added later appear only when set (older run files lack them)."""
    later = {key: value for key, value in (("proposer", getattr(args, "proposer", None)),
                                           ("split", getattr(args, "split", None)),
                                           ("data", list(getattr(args, "data", None) or [])),
                                           ("items", getattr(args, "items", None)),
                                           ("held_out_only", getattr(args, "held_out_only", False))) if value}
    return {"setting": args.setting, **later, "model": str(args.model), "dtype": args.dtype, "k": args.k,
            "concurrency": args.concurrency, "datasets": list(args.dataset or []), "limit": args.limit,
            "offset": args.offset, "max_tokens": args.max_new_tokens, "enforce_eager": bool(args.enforce_eager)}


def check(args) -> None:
    """Refuse a one-setting run asked for wrongly, before vLLM loads."""
    if not args.out:
        raise BenchError("--setting runs one setting in this process and needs --out FILE.json")
    if (args.setting == CUSTOM) != bool(args.proposer):
        raise BenchError("--proposer goes with --setting custom, and --setting custom needs --proposer MODULE.CLASS")
    if args.setting == "oracle" and not args.reference:
        raise BenchError("--setting oracle needs --reference (the `none` setting's output)")


def run_one(args, selection) -> None:
    """Generate the chats with args.setting (the parsed `bench vllm` options) and write args.out."""
    check(args)
    os.environ.update(SETTINGS.get(args.setting, (None, None, {}))[2])
    if args.setting == "oracle":
        os.environ["OOSPEC_VLLM_ORACLE"] = str(Path(args.reference).resolve())
    # The sidecar's adapter: checked against with the sidecar, and with --held-out-only (which `bench vllm` passes
    # on only when a setting runs the sidecar) for every setting, so that all of them run the same chats.
    with_adapter = args.setting == SIDECAR_SETTING or selection.held_out_only
    chats = load_chats(selection, sidecar_adapter() if with_adapter else None)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from oospec.integrations.vllm.context import EXTRA_ARGS_KEY

    spec = speculative_config(args.setting, args.k, args.proposer)
    # Per-request acceptance counts (tau) exist only with speculation; vLLM refuses the option without it.
    spec_metrics = {"per_request_spec_decode_metrics": "summary"} if spec else {}
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0, speculative_config=spec,
              enable_prefix_caching=False, disable_log_stats=False, enforce_eager=args.enforce_eager, **spec_metrics)
    tok = llm.get_tokenizer()
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
