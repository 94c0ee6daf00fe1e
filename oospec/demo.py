"""`oospec demo`: one API-Bank tool call written by plain greedy decoding and by oospec, side by side."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from oospec.bench.datasets import load_dataset
from oospec.drafters import make_drafter
from oospec.engine.engine import Engine


def run_demo(model: str, method: str, sample_index: int, warmup_samples: int, max_new_tokens: int,
             threads: int | None = None) -> bool:
    console = Console()
    if threads:
        import torch

        torch.set_num_threads(threads)
    console.print(f"[bold]oospec demo[/]: target [cyan]{model}[/] (first run downloads and converts it once)")
    engine = Engine.from_pretrained(model)
    samples = load_dataset("apibank", split="1")
    sample = samples[sample_index % len(samples)]
    drafter = make_drafter(method)
    # An agent makes many calls; the drafter learns the target's habits (call wrapper, whitespace) and
    # remembers past calls. Give it the calls just before this one, as an agent session would have.
    history = [samples[(sample_index - k) % len(samples)] for k in range(warmup_samples, 0, -1)]
    for i, past in enumerate(history, 1):
        console.print(f"[dim]earlier call {i}/{len(history)} of the session ({past.id})...[/]")
        engine.generate(past.messages, tools=past.chat_tools(), tool_schemas=past.tools, dialect=past.dialect,
                        method=drafter, max_new_tokens=max_new_tokens)
    question = next(m["content"] for m in reversed(sample.messages) if m["role"] == "user")
    console.print(f"\n[bold]request[/] ({sample.id}, {len(sample.tools)} tools in the system prompt):")
    console.print(question.strip()[-600:], markup=False)
    results = {}
    for name, how in (("ar", "ar"), (method, drafter)):
        console.print(f"[dim]decoding with {name}...[/]")
        results[name] = engine.generate(sample.messages, tools=sample.chat_tools(), tool_schemas=sample.tools,
                                        dialect=sample.dialect, method=how, max_new_tokens=max_new_tokens)
    base, fast = results["ar"], results[method]
    for name, res in results.items():
        console.print(f"\n[bold]{name}[/] wrote:")
        console.print(res.text, markup=False)
    table = Table(title=f"ar vs {method}: {model}, {base.prompt_tokens}-token prompt")
    table.add_column("method", no_wrap=True)
    for col in ("tokens", "forwards", "tau", "prefill s", "decode s", "total s", "decode x"):
        table.add_column(col, justify="right", no_wrap=True)
    for name, res in results.items():
        s = res.stats
        table.add_row(name, str(s.new_tokens), str(s.target_forwards), f"{s.tau:.2f}", f"{s.prefill_s:.2f}",
                      f"{s.decode_s:.2f}", f"{s.prefill_s + s.decode_s:.2f}",
                      f"{base.stats.decode_s / s.decode_s:.2f}x" if s.decode_s else "-")
    console.print(table)
    identical = np.array_equal(base.tokens, fast.tokens)
    console.print(f"token ids identical to greedy decoding: [bold]{'yes' if identical else 'NO'}[/]")
    calls = sample.parse(fast.text)
    if calls:
        console.print(f"parsed call: {calls[0].name}({calls[0].arguments})", markup=False)
    return identical
