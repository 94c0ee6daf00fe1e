"""`oospec demo`: one API-Bank tool call written by plain greedy decoding and by oospec, side by side."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from oospec.datasets import load_dataset
from oospec.engine.threads import torch_threads
from oospec.models.registry import DEFAULT_BUDGET, DEFAULT_DEVICE, DEFAULT_DTYPE
from oospec.pipeline import Pipeline, load, sidecar_lines
from oospec.sidecar.process import SidecarSettings

TABLE_COLUMNS = ("tokens", "forwards", "tau", "prefill", "decode", "total", "decode x")  # fits 80 columns


def run_demo(model: str, method: str, sample_index: int, warmup_samples: int, max_new_tokens: int,
             threads: int | None = None, sidecar: SidecarSettings | None = SidecarSettings(), *,
             dtype: str = DEFAULT_DTYPE, device: str = DEFAULT_DEVICE, optimize: bool = True,
             budget: int = DEFAULT_BUDGET) -> bool:
    """sidecar: the sidecar of a method that uses one (None for the others). threads: the target's (default:
    all cores less the sidecar's, oospec.pipeline.target_threads)."""
    console = Console()
    console.print(f"[bold]oospec demo[/]: target [cyan]{model}[/] (first run downloads and converts it once)")
    if sidecar is not None:
        console.print(f"starting the sidecar [cyan]{sidecar.model}[/] in its own process "
                      f"({sidecar.threads} thread(s) on {sidecar.device})")
    with load(model, method, sidecar=sidecar, threads=threads, budget=budget, dtype=dtype, device=device,
              optimize=optimize) as pipe:
        console.print(f"target threads: {pipe.threads}")
        return _demo(console, pipe, model, method, sample_index, warmup_samples, max_new_tokens)


def _demo(console, pipe: Pipeline, model, method, sample_index, warmup_samples, max_new_tokens) -> bool:
    engine, drafter = pipe.engine, pipe.drafter
    samples = load_dataset("apibank", split="1")
    sample = samples[sample_index % len(samples)]
    # An agent makes many calls; the drafter learns the target's habits (call wrapper, whitespace) and
    # remembers past calls. Give it the calls just before this one, as an agent session would have.
    history = [samples[(sample_index - k) % len(samples)] for k in range(warmup_samples, 0, -1)]
    for i, past in enumerate(history, 1):
        console.print(f"[dim]earlier call {i}/{len(history)} of the session ({past.id})...[/]")
        engine.generate(past.request(max_new_tokens=max_new_tokens, budget=pipe.budget), drafter=drafter)
    question = next(m["content"] for m in reversed(sample.messages) if m["role"] == "user")
    console.print(f"\n[bold]request[/] ({sample.id}, {len(sample.tools)} tools in the system prompt):")
    console.print(question.strip()[-600:], markup=False)
    results = {}
    # Equal cores: `ar` gets the target's threads and the sidecar's (a method with a sidecar splits the same total).
    on_cpu = pipe.sidecar is not None and pipe.sidecar.device == "cpu"
    cores = pipe.threads + ((pipe.sidecar.threads or 0) if on_cpu else 0)
    for name, how in (("ar", None), (method, drafter)):
        console.print(f"[dim]decoding with {name}" + (f" on {cores} cores" if how is None else "") + "...[/]")
        with torch_threads(cores if how is None else pipe.threads):
            results[name] = engine.generate(sample.request(max_new_tokens=max_new_tokens, budget=pipe.budget),
                                            drafter=how)
    base, fast = results["ar"], results[method]
    for name, res in results.items():
        console.print(f"\n[bold]{name}[/] wrote:")
        console.print(res.text, markup=False)
    table = results_table(results, title=f"ar vs {method}: {model}, {base.prompt_tokens}-token prompt (times in s)")
    console.print(table)
    identical = np.array_equal(base.tokens, fast.tokens)
    console.print(f"token ids identical to greedy decoding: [bold]{'yes' if identical else 'NO'}[/]")
    calls = sample.parse(fast.text)
    if calls:
        console.print(f"parsed call: {calls[0].name}({calls[0].arguments})", markup=False)
    lines = sidecar_lines(pipe.sidecar_report)
    if lines:
        console.print()
        for line in lines:
            console.print(line, markup=False)
    return identical


def results_table(results: dict, title: str) -> Table:
    """One row per method; decode x: ar's decode time over the method's (the first row is ar)."""
    base = next(iter(results.values()))
    table = Table(title=title)
    table.add_column("method", no_wrap=True)
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="right", no_wrap=True)
    for name, res in results.items():
        s = res.stats
        table.add_row(name, str(s.new_tokens), str(s.target_forwards), f"{s.tau:.2f}", f"{s.prefill_s:.2f}",
                      f"{s.decode_s:.2f}", f"{s.prefill_s + s.decode_s:.2f}",
                      f"{base.stats.decode_s / s.decode_s:.2f}x" if s.decode_s else "-")
    return table
