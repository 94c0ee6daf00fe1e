"""Any other tool-calling data, one ``{"messages", "tools", "gold"}`` record per sample."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from oospec.datasets.sample import DatasetError, Sample, Samples, build_samples
from oospec.tools.dialects import DEFAULT_DIALECT, ToolCall
from oospec.tools.schema import tools_from_openai


def generic_samples(records: Sequence[Any], *, source: str, dialect: str | None) -> Samples:
    """``messages`` as for a chat template, ``tools`` in OpenAI form, gold under ``gold``, ``tool_calls`` or
    ``answer``; optional ``id``, ``dataset``, ``dialect`` (default ``dialect``, else hermes) and ``meta``."""

    def make(i: int, rec: Any, _samples: Samples) -> list[Sample]:
        messages = rec.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) and "role" in m for m in messages):
            raise DatasetError("'messages' must be a list of {role, content} objects")
        tools = tools_from_openai(rec.get("tools") or [])
        raw_gold = next((rec[k] for k in ("gold", "tool_calls", "answer") if rec.get(k) is not None), None)
        gold = None
        if raw_gold is not None:
            raw_gold = raw_gold if isinstance(raw_gold, list) else [raw_gold]
            gold = [ToolCall.from_dict(c) for c in raw_gold]
        meta = dict(rec.get("meta") or {})
        return [Sample(id=str(rec.get("id", f"{Path(source).stem}-{i}")),
                       dataset=str(rec.get("dataset", Path(source).stem)),
                       messages=[dict(m) for m in messages], tools=tools, gold=gold,
                       dialect=str(rec.get("dialect") or dialect or DEFAULT_DIALECT), meta=meta)]

    return build_samples(records, source, make)


__all__ = ["generic_samples"]
