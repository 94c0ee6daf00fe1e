"""One multi-turn API-Bank dialogue replayed turn by turn against the server (`oospec bench serve`).

API-Bank's level-1 items that come from the same dialogue file are the successive turns of one agent
session: each prompt is the same system prompt (the tools) and the dialogue so far, ending with the request
for the next call. The benchmark loads the target once, then for every (method, prefix reuse on/off) starts a
fresh server (new drafter, empty prefix cache) on a loopback port in this process, replays the turns through
the official `openai` client, and records each turn's client-side latency with the server's own statistics.
Greedy outputs must be identical across configurations; the report says whether they were.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from oospec.errors import OospecError
from oospec.models.registry import DEFAULT_PREFIX_CACHE_MB

if TYPE_CHECKING:  # the sidecar (and torch) load only when a method needs it
    from oospec.sidecar.process import SidecarSettings


# --------------------------------------------------------------------------------------------------
# The dialogue
# --------------------------------------------------------------------------------------------------


def dialogues() -> dict[str, list]:
    """API-Bank level-1 samples grouped by dialogue file, turns in order."""
    from oospec.datasets import group_sessions, load_dataset

    return {name.rpartition(":")[2]: turns for name, turns in group_sessions(load_dataset("apibank", split="1"))}


def pick_dialogue(name: str | None) -> tuple[str, list]:
    groups = dialogues()
    if name:
        if name not in groups:
            raise OospecError(f"no API-Bank level-1 dialogue {name!r}; some are: {', '.join(sorted(groups)[:5])}")
        return name, groups[name]
    # The most turns, then the longest final prompt: the case prefix reuse is for.
    return max(groups.items(), key=lambda kv: (len(kv[1]), len(kv[1][-1].messages[-1]["content"])))


def turn_request(sample, max_tokens: int) -> dict:
    """The chat-completions request of one turn: the tools are described in the system prompt (as in API-Bank's
    evaluation), and also given as `tools` so the server can draft and parse calls."""
    from oospec.tools.schema import to_openai

    return {
        "messages": sample.messages,
        "tools": [to_openai(t) for t in sample.tools],
        "max_tokens": max_tokens,
        "temperature": 0,
        "extra_body": {"oospec": {"dialect": sample.dialect, "tools_in_prompt": True, "return_token_ids": True}},
    }


# --------------------------------------------------------------------------------------------------
# A server in this process
# --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(service, host: str = "127.0.0.1", port: int | None = None):
    """Run the app for `service` with uvicorn on a background thread; yields the base URL."""
    import uvicorn

    from oospec.server.app import create_app

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="oospec-replay-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise OospecError(f"the server did not start on {host}:{port}")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(60)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


@dataclass
class Config:
    method: str
    reuse: bool

    @property
    def label(self) -> str:
        return f"{self.method} {'reuse' if self.reuse else 'cold'}"


@dataclass
class TurnResult:
    turn: int
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str
    stats: dict
    token_ids: list[int] = field(repr=False, default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)


def replay(base_url: str, model: str, turns: list, max_tokens: int) -> list[TurnResult]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    client.chat.completions.create(messages=[{"role": "user", "content": "Hello"}], model=model, max_tokens=4)  # warm
    results = []
    for i, sample in enumerate(turns):
        t0 = time.perf_counter()
        resp = client.chat.completions.create(model=model, **turn_request(sample, max_tokens))
        latency = time.perf_counter() - t0
        stats = resp.model_extra["oospec"]
        calls = [{"name": c.function.name, "arguments": c.function.arguments}
                 for c in resp.choices[0].message.tool_calls or ()]
        results.append(TurnResult(
            turn=i + 1, latency_s=latency, prompt_tokens=resp.usage.prompt_tokens,
            cached_tokens=resp.usage.prompt_tokens_details.cached_tokens, completion_tokens=resp.usage.completion_tokens,
            finish_reason=resp.choices[0].finish_reason,
            stats={k: stats.get(k) for k in ("tau", "target_forwards", "prefill_s", "decode_s", "method", "drafter")},
            token_ids=stats["completion_token_ids"], tool_calls=calls,
        ))
    return results


def run(target: str, methods: list[str], sidecar: SidecarSettings, *, dialogue: str | None = None,
        turns: int | None = None, max_tokens: int = 128, prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB, threads: int | None = None,
        dtype: str = "auto", device: str = "cpu", optimize: bool = True) -> dict:
    """Replay the dialogue (the longest level-1 one unless named; its first `turns` turns) for every method with
    prefix reuse off and on; `sidecar` is started once if a method needs one. Returns the report."""
    from oospec.drafters import SIDECAR_DRAFTERS, make_drafter
    from oospec.engine.engine import Engine
    from oospec.server.service import ModelService, ServerConfig

    if threads:
        import torch

        torch.set_num_threads(threads)
    name, samples = pick_dialogue(dialogue)
    samples = samples[:turns] if turns else samples
    configs = [Config(m, reuse) for m in methods for reuse in (False, True)]
    engine = Engine.from_pretrained(target, dtype=dtype, device=device, optimize=optimize)
    engine.generate([{"role": "user", "content": "Hi"}], max_new_tokens=2)
    print(f"dialogue {name}: {len(samples)} turns; target {target}; configs: "
          f"{', '.join(c.label for c in configs)}", file=sys.stderr)
    client, trained = None, []
    if any(c.method in SIDECAR_DRAFTERS for c in configs):
        from oospec.sidecar.process import make_sidecar, resolve_adapter
        from oospec.sidecar.provenance import describe, not_held_out

        # Warned about, not refused: the sidecar's hints on these turns are recall, so its speed-up there is
        # not what a fresh dialogue gets.
        adapter = resolve_adapter(sidecar.model, sidecar.adapter)
        trained = not_held_out(adapter, [s.provenance_request() for s in samples])
        if trained:
            print(f"WARNING: {len(trained)} of the {len(samples)} turns are not held out from the sidecar adapter's "
                  f"training data: {describe(trained)}", file=sys.stderr)
        client = make_sidecar(sidecar)
    results: dict[str, list[TurnResult]] = {}
    try:
        for config in configs:
            # A fresh drafter per configuration (drafters learn across turns); one sidecar process for all.
            options = {"sidecar": client} if config.method in SIDECAR_DRAFTERS else {}
            service = ModelService(engine, ServerConfig(
                model_name=target, method=config.method, prefix_cache_mb=prefix_cache_mb if config.reuse else 0,
            ), make_drafter(config.method, **options))
            with serving(service) as url:
                results[config.label] = replay(url, target, samples, max_tokens)
            service.close()
            total = sum(r.latency_s for r in results[config.label])
            print(f"  {config.label:24} total {total:7.2f} s", file=sys.stderr)
    finally:
        if client is not None:
            client.close()
    reference = results[configs[0].label]
    identical = {label: all(a.token_ids == b.token_ids for a, b in zip(rs, reference)) for label, rs in results.items()}
    return {
        "dialogue": name,
        "target": target,
        "threads": threads,
        "sidecar": sidecar.model if client is not None else None,
        "sidecar_threads": sidecar.threads if client is not None else None,
        "max_tokens": max_tokens,
        "configs": [c.label for c in configs],
        "identical_to_first": identical,
        "trained_turns": trained,  # turns the sidecar adapter's manifest does not hold out (provenance.not_held_out)
        "turns": {label: [vars(r) for r in rs] for label, rs in results.items()},
    }


def markdown(report: dict) -> str:
    labels = report["configs"]
    turns = report["turns"]
    base = labels[0]
    lines = [
        f"Dialogue `{report['dialogue']}` (API-Bank level 1), target `{report['target']}`, "
        f"max_tokens {report['max_tokens']}, {report['threads'] or 'all'} target thread(s)"
        + (f", sidecar `{report['sidecar']}` on {report['sidecar_threads']} thread(s)" if report.get("sidecar") else "")
        + ". Latency per turn in seconds, client side (request sent to full response received).",
        "",
        *([f"**WARNING: {len(report['trained_turns'])} turn(s) the sidecar adapter used in training (see serve.json "
           "`trained_turns`): its hints there are recall**", ""] if report.get("trained_turns") else []),
        "| turn | prompt tokens | " + " | ".join(labels) + " | cached tokens (reuse) |",
        "|---:|---:|" + "---:|" * len(labels) + "---:|",
    ]
    reuse_label = next((lb for lb in labels if lb.endswith("reuse")), None)
    for i, row in enumerate(turns[base]):
        cells = [f"{turns[lb][i]['latency_s']:.2f}" for lb in labels]
        cached = turns[reuse_label][i]["cached_tokens"] if reuse_label else 0
        lines.append(f"| {row['turn']} | {row['prompt_tokens']} | " + " | ".join(cells) + f" | {cached} |")
    totals = {lb: sum(r["latency_s"] for r in turns[lb]) for lb in labels}
    lines.append("| total | | " + " | ".join(f"{totals[lb]:.2f}" for lb in labels) + " | |")
    lines += ["", "| configuration | total s | speed-up vs " + base + " | prefill s | decode s | mean tau | "
              "sidecar hint in time | identical output |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for lb in labels:
        rs = turns[lb]
        prefill = sum(r["stats"]["prefill_s"] for r in rs)
        decode = sum(r["stats"]["decode_s"] for r in rs)
        tau = sum(r["stats"]["tau"] for r in rs) / len(rs)
        reports = [(r["stats"].get("drafter") or {}).get("oospec") or (r["stats"].get("drafter") or {}).get("sidecar")
                   for r in rs]
        hints = f"{sum(bool(x and x.get('arrived')) for x in reports)}/{len(rs)}" if any(reports) else "-"
        lines.append(f"| {lb} | {totals[lb]:.2f} | {totals[base] / totals[lb]:.2f}x | {prefill:.2f} | {decode:.2f} | "
                     f"{tau:.2f} | {hints} | {'yes' if report['identical_to_first'][lb] else 'NO'} |")
    return "\n".join(lines) + "\n"
