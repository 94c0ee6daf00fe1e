"""Synthetic tool-call requests from tools' schemas: test data for the training pipeline (rows, traces, the
evaluation), where any valid call of a real tool will do. The shipped adapters were trained on none of them."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from oospec.datasets import Sample
from oospec.tools.dialects import ToolCall
from oospec.tools.schema import Param, Tool

SYSTEM = "You are a helpful assistant that calls tools when a request needs one."

_WORDS = ["Paris", "Berlin", "Tokyo", "Alice Chen", "Bob Smith", "project alpha", "blue", "weekly report",
          "Dr. Patel", "savings", "order 5521", "New York", "jazz", "the quarterly budget", "room 204", "Lisbon"]
_ASK = ["Please {verb} with {args}.", "Can you {verb}? Use {args}.", "I need you to {verb}: {args}.",
        "{Verb} for me, {args}.", "Could you {verb} ({args})?"]


def _value(p: Param, rng: random.Random):
    if p.enum:
        return rng.choice(list(p.enum))
    if p.type == "integer":
        return rng.choice([1, 2, 3, 5, 7, 10, 12, 20, 30, 42, 100, 2023, 12345])
    if p.type == "number":
        return rng.choice([0.5, 1.5, 2.75, 10.0, 99.9, 3.14])
    if p.type == "boolean":
        return rng.choice([True, False])
    if p.type == "array":
        return rng.sample(_WORDS, 2)
    if p.type == "object":
        return {"name": rng.choice(_WORDS)}
    name = p.name.lower()
    if "date" in name or "time" in name:
        return f"2023-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}" + (
            f" {rng.randint(0, 23):02d}:{rng.choice(['00', '15', '30'])}:00" if "time" in name else "")
    if "id" in name or "token" in name or "number" in name:
        return "".join(rng.choice("0123456789") for _ in range(8))
    if "email" in name:
        return f"{rng.choice(['alice', 'bob', 'carol'])}@example.com"
    return rng.choice(_WORDS)


def _phrase(tool: Tool, args: dict, rng: random.Random) -> str:
    desc = (tool.description or tool.name).strip().rstrip(".")
    verb = desc[0].lower() + desc[1:] if desc else tool.name
    parts = [f"{k.replace('_', ' ')} {json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}"
             for k, v in args.items()]
    text = rng.choice(_ASK).format(verb=verb, Verb=verb[0].upper() + verb[1:], args=", ".join(parts) or "no options")
    return text


def synthetic_requests(tools: Sequence[Tool], per_tool: int = 4, seed: int = 0, distractors: int = 2) -> list[Sample]:
    """Requests in hermes style (tools through the chat template), each naming its tool's task and values,
    with a few other training tools offered alongside; the gold call is what was asked for."""
    rng = random.Random(seed)
    out = []
    pool = list(tools)
    for tool in tools:
        for k in range(per_tool):
            args = {}
            for p in tool.parameters:
                if p.name in tool.required or rng.random() < 0.5:
                    args[p.name] = _value(p, rng)
            others = rng.sample([t for t in pool if t.name != tool.name], min(distractors, len(pool) - 1))
            offered = others + [tool]
            rng.shuffle(offered)
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _phrase(tool, args, rng)}]
            out.append(Sample(id=f"synthetic-{tool.name}-{k}", dataset="synthetic", messages=messages, tools=offered,
                              gold=[ToolCall(tool.name, args)], dialect="hermes", meta={"synthetic": True}))
    return out
