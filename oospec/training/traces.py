"""Teacher traces: what a larger model writes, greedily, for each training request. Resumable."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from oospec.datasets import Sample
from oospec.models.registry import DEFAULT_MAX_NEW_TOKENS
from oospec.tools.schema import to_openai


def trace_record(sample: Sample, text: str) -> dict:
    try:
        calls = sample.parse(text)
    except Exception:
        calls = []
    call = calls[0] if calls else None
    return {"id": sample.id, "dataset": sample.dataset, "messages": sample.messages,
            "tools": [to_openai(t) for t in sample.tools], "chat_tools": sample.chat_tools(),
            "dialect": sample.dialect, "text": text,
            "call": {"name": call.name, "arguments": call.arguments} if call is not None else None,
            "calls": [{"name": c.name, "arguments": c.arguments} for c in calls]}


def read_traces(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    if path.suffix == ".gz":  # shipped traces are gzipped (`gzip -n`: the same bytes on every machine)
        import gzip

        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by an interrupted run: redone next time
                continue
    return out


# A reply that has written this many tokens without any character a call starts with is a plain answer: the
# sidecar learns "no call" from its first few characters, so the rest is not worth decoding.
PLAIN_ANSWER_TOKENS = 48
_CALL_MARKS = ("{", "[", "(", "<tool_call>")


def _stop_plain_answers(tokenizer):
    seen: list[int] = []

    def on_tokens(tokens) -> bool:
        seen.extend(int(t) for t in tokens)
        if len(seen) < PLAIN_ANSWER_TOKENS:
            return False
        text = tokenizer.decode(seen)
        return not any(m in text for m in _CALL_MARKS)
    return on_tokens


_GROUP = 3  # requests of one group at most: enough to reuse a dialogue's prefix, few enough to interleave


def _interleaved(samples: Sequence[Sample]) -> list[Sample]:
    """Requests with the same tools and dialogue together (their shared prompt prefix is prefilled once), and
    those groups taken from each source in turn, so a run stopped early has traced every source alike."""
    from itertools import zip_longest

    ordered = sorted(samples, key=lambda s: json.dumps([[t.name for t in s.tools], s.messages], ensure_ascii=False))
    groups: dict[str, list[list[Sample]]] = {}
    last_tools = None
    for s in ordered:
        tools = [t.name for t in s.tools]
        source = f"{s.dataset}:{s.meta.get('category') or s.meta.get('level') or ''}"
        if tools != last_tools or not groups.get(source) or len(groups[source][-1]) >= _GROUP:
            groups.setdefault(source, []).append([])
        groups[source][-1].append(s)
        last_tools = tools
    by_source = [groups[k] for k in sorted(groups)]
    return [s for turn in zip_longest(*by_source) for group in turn if group for s in group]


def record_traces(engine, samples: Sequence[Sample], path: str | Path, *, method: str = "toolspec",
                  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, progress: bool = True, prefix_cache_bytes: int = 2 << 30) -> list[dict]:
    """Append a trace per sample not yet in `path` (greedy: any lossless method writes the same text).

    Requests are taken in the order of their messages, so the turns of one dialogue (and requests with the
    same tool list) follow each other and their shared prompt prefix is prefilled once."""
    from tqdm.auto import tqdm

    from oospec.drafters import make_drafter
    from oospec.engine.prefix_cache import PrefixCache

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {t["id"] for t in read_traces(path)}
    todo = _interleaved([s for s in samples if s.id not in done])
    drafter = make_drafter(method)
    cache = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes else None
    with open(path, "a", encoding="utf-8") as f:
        for sample in tqdm(todo, desc="traces", unit="req", disable=not progress):
            result = engine.generate(sample.request(max_new_tokens=max_new_tokens), drafter=drafter, prefix_cache=cache,
                                     on_tokens=_stop_plain_answers(engine.tokenizer))
            f.write(json.dumps(trace_record(sample, result.text), ensure_ascii=False) + "\n")
            f.flush()
    return read_traces(path)


def traces_from_bench(samples_jsonl: str | Path, dataset: str, split: str | None = None,
                      method: str = "ar") -> list[dict]:
    """Teacher traces from a `bench run`: its `ar` outputs are the target's greedy calls on those items."""
    from oospec.datasets import load_dataset

    by_id = {s.id: s for s in load_dataset(dataset, split=split)}
    out = []
    for line in Path(samples_jsonl).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("method") == method and rec.get("sample_id") in by_id:
            out.append(trace_record(by_id[rec["sample_id"]], rec["text"]))
    return out
