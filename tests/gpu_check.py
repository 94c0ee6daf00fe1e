"""One prepared run on a CUDA GPU, beside `make test-gpu` (results: experiments/results/gpu-*/).

For random-initialised models of the real architectures (no weights travel to the device; timing and
row invariance do not depend on weight values, and near-uniform logits make greedy choices as fragile as they
get), stock transformers forwards and then the padded invariant forward (oospec.engine.padded):
  * probe: is every row of a tree verification forward bitwise the token's 1-row forward, at every layer?
  * equivalence: speculative output against the engine's own plain greedy output, adversarial drafters;
  * cost curve: seconds per verification forward of k tokens on a cached prompt;
  * speed: plain greedy vs a drafter that always verifies `b` correct tokens (the oracle, budget b), prefill.
Results are written after every step (a run cut short keeps what it measured).

    python tests/gpu_check.py --out $OUT [--presets qwen2.5-1.5b,qwen2.5-7b,qwen2.5-0.5b]
    python tests/gpu_check.py --device cpu --presets tiny --quick --out /tmp/gpu-check   # dry run
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the adversarial drafters, run as a script

from adversarial import DecoyOracleDrafter, HugeTreeDrafter, RandomTreeDrafter  # noqa: E402

from oospec.bench.cost_curve import measure  # noqa: E402
from oospec.drafters.oracle import OracleDrafter  # noqa: E402
from oospec.engine import padded  # noqa: E402
from oospec.engine.decode import generate  # noqa: E402
from oospec.engine.drafting import Drafter, Request  # noqa: E402
from oospec.engine.precision import PADDED_PROBE_PROMPT, probe  # noqa: E402
from oospec.engine.target import TargetBackend  # noqa: E402
from oospec.models.random_init import random_model  # noqa: E402


def build(preset: str, dtype: torch.dtype, device: str):
    if preset == "tiny":
        from helpers import tiny_model

        return tiny_model("qwen2").to(dtype).to(device)
    return random_model(preset, dtype, device)


def equivalence(target: TargetBackend, vocab: int, prompts: list[np.ndarray], new: int) -> list[dict]:
    rows = []
    for case, prompt in enumerate(prompts):
        plain = generate(target, Drafter(), Request(prompt_ids=prompt, max_new_tokens=new)).tokens
        for drafter in (RandomTreeDrafter(vocab, case), HugeTreeDrafter(vocab, case),
                        DecoyOracleDrafter(plain, vocab, case)):
            out = generate(target, drafter, Request(prompt_ids=prompt, max_new_tokens=new, budget=63))
            differ = np.flatnonzero(out.tokens[: plain.size] != plain[: out.tokens.size])
            rows.append({"prompt": int(prompt.size), "drafter": drafter.name, "tau": round(out.stats.tau, 2),
                         "identical": bool(np.array_equal(out.tokens, plain)),
                         "first_difference": int(differ[0]) if differ.size else None})
    return rows


def speed(target: TargetBackend, prompt: np.ndarray, new: int, budgets: tuple[int, ...]) -> dict:
    generate(target, Drafter(), Request(prompt_ids=prompt, max_new_tokens=8))  # warm-up: kernels, allocator
    plain = generate(target, Drafter(), Request(prompt_ids=prompt, max_new_tokens=new))
    result = {"prompt": int(prompt.size), "new_tokens": int(plain.tokens.size),
              "prefill_s": round(plain.stats.prefill_s, 4), "ar_decode_s": round(plain.stats.decode_s, 4),
              "ar_ms_per_token": round(1000 * plain.stats.decode_s / max(plain.tokens.size - 1, 1), 3)}
    for budget in budgets:
        out = generate(target, OracleDrafter(plain.tokens), Request(prompt_ids=prompt, max_new_tokens=new,
                                                                    budget=budget))
        assert np.array_equal(out.tokens, plain.tokens)
        stats = out.stats
        result[f"oracle_b{budget}"] = {"tau": round(stats.tau, 2), "decode_s": round(stats.decode_s, 4),
                                       "draft_s": round(stats.draft_s, 4),
                                       "ms_per_forward": round(1000 * stats.decode_s / max(stats.target_forwards - 1, 1),
                                                               3),
                                       "decode_speedup": round(plain.stats.decode_s / stats.decode_s, 2)}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="qwen2.5-1.5b,qwen2.5-7b,qwen2.5-0.5b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="short prompts and replies (a dry run)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
    report = {"device": device_name, "torch": torch.__version__, "dtype": args.dtype, "presets": {}}
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    import transformers

    report["transformers"] = transformers.__version__
    path = out / "gpu_check.json"
    new, prompt_len = (24, 90) if args.quick else (128, 650)
    rng = np.random.default_rng(0)

    def save():
        path.write_text(json.dumps(report, indent=1))

    for preset in args.presets.split(","):
        entry = report["presets"][preset] = {}
        try:
            t0 = time.perf_counter()
            model = build(preset, dtype, args.device)
            vocab = int(model.config.vocab_size)
            entry["build_s"] = round(time.perf_counter() - t0, 1)
            prompts = [rng.integers(0, vocab, n) for n in ((40, 90) if args.quick else (120, 650))]
            speed_prompt = rng.integers(0, vocab, prompt_len)
            for mode in ("stock", "padded"):
                if mode == "padded":
                    entry["install"] = padded.install(model, allow_cpu=args.device == "cpu")
                target = TargetBackend(model)
                t0 = time.perf_counter()
                entry[f"{mode}_probe"] = asdict(probe(model, prompt_len=PADDED_PROBE_PROMPT))
                entry[f"{mode}_probe_s"] = round(time.perf_counter() - t0, 2)
                save()
                ks = (1, 2, 4, 8, 16, 32, 64) if mode == "stock" else (1, 16, 64)
                entry[f"{mode}_curve"] = measure(model, prompt_len=prompt_len, ks=ks, repeats=3 if args.quick else 9)
                save()
                entry[f"{mode}_equivalence"] = equivalence(target, vocab, prompts, new // 2 if mode == "stock" else new)
                save()
                entry[f"{mode}_speed"] = speed(target, speed_prompt, new, (6, 16, 63))
                save()
                measured = {k: v for k, v in entry.items() if k.startswith(mode)}
                print(preset, mode, json.dumps(measured, default=str)[:1500], flush=True)
            del model, target
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
        except Exception as exc:  # keep what the other presets measure
            entry["error"] = f"{type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            print(entry["traceback"], flush=True)
        save()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
