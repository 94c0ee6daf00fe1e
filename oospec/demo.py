"""`oospec demo`: one API-Bank tool call written by plain greedy decoding and by oospec, side by side."""

from __future__ import annotations

import json

import numpy as np
from rich.console import Console
from rich.table import Table

from oospec.datasets import load_dataset
from oospec.drafters import SIDECAR_DRAFTERS, make_drafter
from oospec.engine.engine import Engine
from oospec.sidecar.process import SidecarSettings, make_sidecar


def run_demo(model: str, method: str, sample_index: int, warmup_samples: int, max_new_tokens: int,
             threads: int | None = None, sidecar_settings: SidecarSettings = SidecarSettings(), *,
             dtype: str = "auto", device: str = "cpu", optimize: bool = True) -> bool:
    import os

    import torch

    console = Console()
    settings, sidecar = sidecar_settings, None
    uses_sidecar = method in SIDECAR_DRAFTERS
    if uses_sidecar and not threads and settings.device == "cpu":
        threads = max(1, (os.cpu_count() or 2) - (settings.threads or 1))  # the sidecar has the other core(s)
    if threads:
        torch.set_num_threads(threads)
    console.print(f"[bold]oospec demo[/]: target [cyan]{model}[/] (first run downloads and converts it once)")
    if uses_sidecar:
        console.print(f"starting the sidecar [cyan]{settings.model}[/] in its own process "
                      f"({settings.threads} thread(s) on {settings.device}); target threads: {torch.get_num_threads()}")
        sidecar = make_sidecar(settings)
    try:
        engine = Engine.from_pretrained(model, dtype=dtype, device=device, optimize=optimize)
        return _demo(console, engine, model, method, sidecar, sample_index, warmup_samples, max_new_tokens)
    finally:
        if sidecar is not None:
            sidecar.close()


def _demo(console, engine, model, method, sidecar, sample_index, warmup_samples, max_new_tokens) -> bool:
    samples = load_dataset("apibank", split="1")
    sample = samples[sample_index % len(samples)]
    drafter = make_drafter(method, sidecar=sidecar) if sidecar is not None else make_drafter(method)
    # An agent makes many calls; the drafter learns the target's habits (call wrapper, whitespace) and
    # remembers past calls. Give it the calls just before this one, as an agent session would have.
    history = [samples[(sample_index - k) % len(samples)] for k in range(warmup_samples, 0, -1)]
    for i, past in enumerate(history, 1):
        console.print(f"[dim]earlier call {i}/{len(history)} of the session ({past.id})...[/]")
        engine.generate(past.messages, tools=past.chat_tools(), tool_schemas=past.tools, dialect=past.dialect,
                        drafter=drafter, max_new_tokens=max_new_tokens)
    question = next(m["content"] for m in reversed(sample.messages) if m["role"] == "user")
    console.print(f"\n[bold]request[/] ({sample.id}, {len(sample.tools)} tools in the system prompt):")
    console.print(question.strip()[-600:], markup=False)
    results = {}
    for name, how in (("ar", None), (method, drafter)):
        console.print(f"[dim]decoding with {name}...[/]")
        results[name] = engine.generate(sample.messages, tools=sample.chat_tools(), tool_schemas=sample.tools,
                                        dialect=sample.dialect, drafter=how, max_new_tokens=max_new_tokens)
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
    report = getattr(drafter, "report", None)  # a SidecarReport (oospec.drafters.sidecar)
    if report is not None:
        if report.function:
            payload = {"function": report.function, "arguments": report.arguments,
                       "alternatives": report.alternatives or []}
            when = ("before the target's first decode step" if report.tokens_written_at_arrival == 1
                    else f"after {report.tokens_written_at_arrival} tokens" if report.arrived
                    else "after the target had finished")
            console.print(f"\n[bold]sidecar payload[/] ({report.payload_bytes} bytes, computed in "
                          f"{report.compute_s:.1f} s, arrived {when}):")
            console.print(json.dumps(payload, ensure_ascii=False), markup=False)
            if report.followup:
                f = report.followup
                console.print(f"the target chose {f.function}: its slots were asked for after "
                              f"{f.tokens_written_at_submit} tokens"
                              + (f" and arrived after {f.tokens_written_at_arrival}" if f.arrived else ""))
        elif report.no_call:
            console.print(f"\n[bold]sidecar[/]: expects no call (call probability {report.call_probability:.2f})")
        else:
            console.print(f"\n[bold]sidecar[/]: no payload ({report.fault or 'none arrived in time'}); "
                          "decoding went on without hints")
    return identical
