"""Tool calls written as bare or fenced JSON objects, as Qwen2.5-Coder writes them (no vLLM import).

Qwen2.5-Coder's chat template asks for `<tool_call>` tags, but the 0.5B and 1.5B models answer with
```json {"name": ..., "arguments": {...}} ``` instead, so vLLM's hermes parser finds no call in their replies.
Only complete objects count (a streamed reply's half-written object is not a call yet), and only objects
naming one of the request's tools (JSON in an ordinary answer is not mistaken for a call).
"""

from __future__ import annotations

import json
from collections.abc import Container

_FENCE = "```"
_DECODER = json.JSONDecoder()


def may_be_json_call(text: str) -> bool:
    """Whether a reply that starts like `text` is written as JSON calls (so far)."""
    head = text.lstrip()
    return head.startswith(("{", _FENCE)) or (head != "" and _FENCE.startswith(head))


def json_calls(text: str, tool_names: Container[str]) -> list[tuple[str, dict]]:
    """(name, arguments) of each complete call object, in order, until the first thing that is not one."""
    body = text.strip()
    if body.startswith(_FENCE):
        body = body[len(_FENCE):]
        body = body[body.find("\n") + 1:] if "\n" in body else ""  # drop the language tag (```json)
    calls = []
    i = 0
    while True:
        while i < len(body) and (body[i].isspace() or body[i] in ",`"):
            i += 1
        if i >= len(body) or body[i] != "{":
            return calls
        try:
            obj, i = _DECODER.raw_decode(body, i)
        except json.JSONDecodeError:
            return calls  # not complete yet
        args = obj.get("arguments", obj.get("parameters")) if isinstance(obj, dict) else None
        if not (isinstance(obj.get("name"), str) and obj["name"] in tool_names and isinstance(args, dict)):
            return calls
        calls.append((obj["name"], args))
