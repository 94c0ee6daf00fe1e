"""The price list of speculation: wall time of one target forward that verifies k tokens on a cached prompt.

c(k)/c(1) is what turns acceptance statistics into speed: a drafter that gets a tokens accepted from a
k-token tree speeds decoding up by (a+1) * c(1) / c(k).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree

DEFAULT_KS = (1, 2, 4, 8, 16, 32, 64)

# Configurations for random-initialised stand-ins of models too big to download here; timing does not
# depend on weight values, so these give the cost curve of the real model on any device.
ARCH_PRESETS: dict[str, dict] = {
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=False, rms_norm_eps=1e-6,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=True, rms_norm_eps=1e-6,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=True, rms_norm_eps=1e-6,
    ),
}


def random_model(preset_or_config: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A model of the given architecture with random weights (uninitialised memory is enough for timing,
    but it is filled with small normal values so no NaN can take a slow path)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if preset_or_config in ARCH_PRESETS:
        spec = dict(ARCH_PRESETS[preset_or_config])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    else:
        config = AutoConfig.from_pretrained(preset_or_config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    for module in model.modules():  # rotary frequencies are buffers: rebuild them as the model's own init does
        if hasattr(module, "inv_freq") and hasattr(module, "rope_init_fn"):
            fresh = type(module)(config=config, device=device)
            for attr in ("inv_freq", "original_inv_freq"):
                if hasattr(module, attr) and hasattr(fresh, attr):
                    getattr(module, attr).copy_(getattr(fresh, attr))
    return model.eval()


def measure(model: torch.nn.Module, prompt_len: int = 580, ks=DEFAULT_KS, repeats: int = 5, seed: int = 0) -> dict:
    vocab = model.config.vocab_size
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, prompt_len)
    target = TargetBackend(model)
    target.reset(prompt_len + max(ks) + 2)
    t0 = time.perf_counter()
    pending = target.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    seconds = {}
    for k in ks:
        tree = TokenTree.chain(rng.integers(0, vocab, k - 1))
        target.verify(pending, tree)  # warm-up: allocator, kernel selection
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            target.verify(pending, tree)  # never committed: the cache stays at the prompt
            times.append(time.perf_counter() - t)
        seconds[k] = statistics.median(times)
    base = seconds[ks[0]]
    param = next(model.parameters())
    return {
        "model": getattr(model.config, "_name_or_path", "") or model.config.model_type,
        "device": str(param.device),
        "device_name": torch.cuda.get_device_name(param.device) if param.is_cuda else platform.processor(),
        "dtype": str(param.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "prompt_len": prompt_len,
        "prefill_s": prefill_s,
        "repeats": repeats,
        "ks": list(ks),
        "seconds": {str(k): v for k, v in seconds.items()},
        "ratio": {str(k): v / base for k, v in seconds.items()},
    }


def format_table(result: dict) -> str:
    lines = [f"cost curve: {result['model']} on {result['device_name'] or result['device']} ({result['dtype']}, "
             f"{result['threads']} threads), prompt {result['prompt_len']} tokens, median of {result['repeats']}",
             "| k | seconds | c(k)/c(1) |", "|---:|---:|---:|"]
    for k in result["ks"]:
        lines.append(f"| {k} | {result['seconds'][str(k)]:.4f} | {result['ratio'][str(k)]:.2f} |")
    return "\n".join(lines)


def write(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2))
