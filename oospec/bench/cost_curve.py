"""The price list of speculation: wall time of one target forward that verifies k tokens on a cached prompt.

c(k)/c(1) is what turns acceptance statistics into speed: a drafter that gets a tokens accepted from a
k-token tree speeds decoding up by (a+1) * c(1) / c(k).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from oospec.engine.target import TargetBackend
from oospec.models.cpu_features import cpu_model
from oospec.engine.tree import TokenTree



def measure(model: torch.nn.Module, prompt_len: int, ks, repeats: int, seed: int = 0) -> dict:
    """The curve of `ks` on a random `prompt_len`-token prompt, each k timed `repeats` times (their defaults are
    `oospec bench cost-curve`'s options)."""
    vocab = model.config.vocab_size
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, prompt_len)
    target = TargetBackend(model)
    target.reset(prompt_len + max(ks) + 2)
    t0 = time.perf_counter()
    pending = target.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    trees = {k: TokenTree.chain(rng.integers(0, vocab, k - 1)) for k in ks}
    for k in ks:
        target.verify(pending, trees[k])  # warm-up: allocator, kernel selection
    # Round-robin over k, so that drift (clock, the machine's other load) lands on every k alike rather than on
    # whichever k was timed first.
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            t = time.perf_counter()
            target.verify(pending, trees[k])  # never committed: the cache stays at the prompt
            times[k].append(time.perf_counter() - t)
    seconds = {k: statistics.median(times[k]) for k in ks}
    base = seconds[ks[0]]
    param = next(model.parameters())
    return {
        "model": getattr(model.config, "_name_or_path", "") or model.config.model_type,
        "device": str(param.device),
        "device_name": torch.cuda.get_device_name(param.device) if param.is_cuda else cpu_model(),
        "dtype": str(param.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "prompt_len": prompt_len,
        "prefill_s": prefill_s,
        "repeats": repeats,
        "ks": list(ks),
        "seconds": {str(k): v for k, v in seconds.items()},
        "ratio": {str(k): v / base for k, v in seconds.items()},
    }


@contextmanager
def busy_processes(n: int):
    """n single-threaded busy loops (separate processes) for the length of the block: the other programs of a
    machine the model shares, for measuring how the kernels degrade."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, n))]
    try:
        time.sleep(0.2 if loops else 0)  # scheduled before the clock starts
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def format_table(result: dict) -> str:
    busy = f", {result['busy_processes']} busy process(es) beside" if result.get("busy_processes") else ""
    lines = [f"cost curve: {result['model']} on {result['device_name'] or result['device']} ({result['dtype']}, "
             f"{result['threads']} threads{busy}), prompt {result['prompt_len']} tokens read at "
             f"{result['prompt_len'] / result['prefill_s']:.0f} tokens/s, median of {result['repeats']}",
             "| k | seconds | c(k)/c(1) |", "|---:|---:|---:|"]
    for k in result["ks"]:
        lines.append(f"| {k} | {result['seconds'][str(k)]:.4f} | {result['ratio'][str(k)]:.2f} |")
    return "\n".join(lines)


def write(result: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2))
