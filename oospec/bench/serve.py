"""One multi-turn dialogue replayed turn by turn against the server (`oospec bench serve`).

API-Bank's level-1 items that come from the same dialogue file are the successive turns of one agent
session: each prompt is the same system prompt (the tools) and the dialogue so far, ending with the request
for the next call. The dialogue is one of the sessions the item options select (oospec.bench.items, as
`bench run --sessions` selects them): named by --dialogue, else the one with the most turns. The benchmark
loads the target once, then for every (method, prefix reuse on/off) starts a fresh server (new drafter, empty
prefix cache) on a loopback port in this process, replays the turns through the official `openai` client, and
records each turn's client-side latency with the server's own statistics. Greedy outputs must be identical
across configurations; samples.jsonl gives each turn's first difference from the first configuration's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from oospec.bench.items import BenchError
from oospec.bench.records import RecordLog, compared, output_folder, write_json
from oospec.models.registry import DEFAULT_MAX_NEW_TOKENS, DEFAULT_PREFIX_CACHE_MB

if TYPE_CHECKING:  # the sidecar (and torch) load only when a method needs it
    from oospec.sidecar.process import SidecarSettings


# --------------------------------------------------------------------------------------------------
# The dialogue
# --------------------------------------------------------------------------------------------------


def pick_dialogue(samples, name: str | None) -> tuple[str, list]:
    """(name, turns) of one session among `samples` (turns of sessions, in order): the one named, else the most
    turns, then the longest final prompt: the case prefix reuse is for."""
    from oospec.datasets import group_sessions

    groups = {key.rpartition(":")[2]: turns for key, turns in group_sessions(samples)}
    if not groups:
        raise BenchError("no multi-turn session among the selected items (API-Bank level 1 has them)")
    if name:
        if name not in groups:
            raise BenchError(f"no dialogue {name!r} among the selected items; some are: "
                             f"{', '.join(sorted(groups)[:5])}")
        return name, groups[name]
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


def run(target: str, methods: list[str], sidecar: SidecarSettings, selection, *, dialogue: str | None = None,
        turns: int | None = None, max_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB, threads: int | None = None, dtype: str = "auto",
        device: str = "cpu", optimize: bool = True) -> dict:
    """Replay one dialogue of the sessions `selection` (an oospec.bench.items.Selection) picks (`dialogue`, else
    the longest; its first `turns` turns) for every method with prefix reuse off and on; `sidecar` is started
    once if a method needs one, its adapter's training items refused as in every benchmark. Returns the report."""
    from oospec.bench.items import check_trained_items, load_datasets, trained_item_filter
    from oospec.drafters import SIDECAR_DRAFTERS, make_drafter
    from oospec.engine.engine import Engine
    from oospec.server.loopback import serving
    from oospec.server.service import ModelService, ServerConfig

    if threads:
        import torch

        torch.set_num_threads(threads)
    configs = [Config(m, reuse) for m in methods for reuse in (False, True)]
    adapter = None
    if any(c.method in SIDECAR_DRAFTERS for c in configs):
        from oospec.sidecar.process import resolve_adapter

        adapter = resolve_adapter(sidecar.model, sidecar.adapter)
    selection.sessions = True  # offset and limit count dialogues
    exclude = trained_item_filter(adapter) if selection.held_out_only else None
    datasets = load_datasets(selection, exclude=exclude)
    name, samples = pick_dialogue([s for _, items in datasets for s in items], dialogue)
    samples = samples[:turns] if turns else samples
    label = next(lb for lb, items in datasets if any(s.id == samples[0].id for s in items))
    # Only the turns that run are checked: the other selected dialogues are not measured.
    trained = check_trained_items([(label, samples)], adapter, selection.allow_trained_items)
    engine = Engine.from_pretrained(target, dtype=dtype, device=device, optimize=optimize)
    engine.generate([{"role": "user", "content": "Hi"}], max_new_tokens=2)
    print(f"dialogue {name}: {len(samples)} turns; target {target}; configs: "
          f"{', '.join(c.label for c in configs)}", file=sys.stderr)
    client = None
    if any(c.method in SIDECAR_DRAFTERS for c in configs):
        from oospec.sidecar.process import make_sidecar

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
        "dataset": label,
        "turn_ids": [s.id for s in samples],
        "target": target,
        "threads": threads,
        "sidecar": sidecar.model if client is not None else None,
        "sidecar_threads": sidecar.threads if client is not None else None,
        "max_tokens": max_tokens,
        "configs": [c.label for c in configs],
        "identical_to_first": identical,
        "trained_turns": trained,  # turns run with --allow-trained-items (oospec.bench.items.check_trained_items)
        "turns": {label: [vars(r) for r in rs] for label, rs in results.items()},
    }


def write(report: dict, out, datasets: list[str]):
    """serve.json (the report), serve.md (its tables) and samples.jsonl (one record per configuration and turn,
    compared with the first configuration's tokens) in the output folder; returns the folder."""
    folder = output_folder(out, datasets, command="serve")
    reference = report["turns"][report["configs"][0]]
    with RecordLog(folder) as log:
        for config, rows in report["turns"].items():
            for row, ref, sample_id in zip(rows, reference, report["turn_ids"]):
                log.write({"dataset": report["dataset"], "sample_id": sample_id, "method": config,
                           "session": report["dialogue"], **{k: v for k, v in row.items() if k != "token_ids"},
                           "tokens": row["token_ids"], **compared(ref["token_ids"], row["token_ids"])})
    write_json(folder / "serve.json", report)
    (folder / "serve.md").write_text(markdown(report), encoding="utf-8")
    return folder


def markdown(report: dict) -> str:
    labels = report["configs"]
    turns = report["turns"]
    base = labels[0]
    lines = [
        f"Dialogue `{report['dialogue']}` ({report.get('dataset', 'apibank:1')}), target `{report['target']}`, "
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
