"""What the drafters may know about a vLLM request: its tools, messages and dialect.

Two routes, best first:
- `SamplingParams.extra_args["oospec"]`: {"tools", "messages", "tool_choice", "dialect"} (OpenAI shapes), as
  a dict (`LLM.generate` users) or as its JSON text (the OpenAI server's `vllm_xargs` take flat values only:
  a client sends `vllm_xargs={"oospec": context_json(...)}`, or the tool-parser plugin fills it);
- the rendered prompt, for `/v1/completions` and `LLM.generate` users: the `<tools>` block of Qwen/Hermes
  templates (OpenAI JSON, one per line) or the prose tool list of API-Bank prompts, and the conversation's turns.
A request with neither is drafted by prompt lookup and retrieval alone (schema drafting needs tools).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from oospec.datasets.apibank import tools_from_apibank_prompt
from oospec.tools.profile import profile_for
from oospec.tools.dialects import DEFAULT_DIALECT, DIALECTS
from oospec.tools.schema import Tool, tools_from_openai

EXTRA_ARGS_KEY = "oospec"  # SamplingParams.extra_args[EXTRA_ARGS_KEY]: the request context as sent

_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
# The closed turns of a ChatML prompt (Qwen, Hermes); other templates fall back to the whole prompt as one
# user message.
_TURN = re.compile(r"<\|im_start\|>(system|user|assistant|tool)\n(.*?)<\|im_end\|>", re.S)
# Where Qwen's chat template appends the tool list to the system turn (the tools reach the drafters as tools).
_TOOLS_SECTION = "\n\n# Tools\n"


@dataclass(frozen=True)
class RequestContext:
    tools: list[Tool] | None = None  # None: no tools known (schema drafting stays off)
    messages: list[dict] | None = None
    dialect: str | None = None  # oospec.tools.dialects name; None: hermes
    tools_in_prompt: bool | None = None  # True: the prompt describes the tools in prose (API-Bank)
    tool_choice: Any = None


def context_from_extra_args(extra_args: dict | None) -> RequestContext | None:
    """The context a client or tool-parser plugin sent; None when it sent none. Malformed parts are dropped
    (drafting then knows less; the output cannot change)."""
    sent = (extra_args or {}).get(EXTRA_ARGS_KEY)
    if isinstance(sent, str):
        try:
            sent = json.loads(sent)
        except json.JSONDecodeError:
            return None
    if not isinstance(sent, dict):
        return None
    tools = _openai_tools(sent.get("tools"))
    messages = sent.get("messages")
    messages = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else None
    dialect = sent.get("dialect") if sent.get("dialect") in DIALECTS else None
    return RequestContext(tools=tools, messages=messages, dialect=dialect,
                          tools_in_prompt=profile_for(dialect).tools_in_prompt or None, tool_choice=sent.get("tool_choice"))


def context_json(tools: list[dict] | None, messages: list[dict] | None, tool_choice: Any = None,
                 dialect: str | None = None) -> str:
    """The request context as `vllm_xargs` carry it (one JSON string under EXTRA_ARGS_KEY)."""
    return json.dumps({"tools": tools, "messages": messages, "tool_choice": tool_choice, "dialect": dialect},
                      ensure_ascii=False)


def context_from_prompt(text: str, default_system: str | None = None) -> RequestContext:
    """The tools and the conversation as far as the rendered prompt shows them: every closed ChatML turn (the
    sidecar reads the whole conversation, as a client would have sent it), else the whole text as one turn.
    default_system: the system turn the chat template writes when the client sent none (dropped: see
    `template_default_system`)."""
    block = _TOOLS_BLOCK.search(text)
    messages = [{"role": role, "content": content} for role, content in _TURN.findall(text)]
    for m in messages:
        if m["role"] == "system" and _TOOLS_SECTION in m["content"] and "<tools>" in m["content"]:
            m["content"] = m["content"].split(_TOOLS_SECTION, 1)[0]
    messages = [m for m in messages if m["role"] != "system" or (m["content"] and m["content"] != default_system)]
    messages = messages or [{"role": "user", "content": text}]
    if block is not None:
        specs = []
        for line in block.group(1).splitlines():
            try:
                specs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        tools = _openai_tools(specs)
        if tools:
            return RequestContext(tools=tools, messages=messages, dialect=DEFAULT_DIALECT)
    try:
        tools = tools_from_apibank_prompt(text)
    except Exception:  # the prose list is user text: an unreadable one means no tools, never an error
        tools = []
    if tools:
        return RequestContext(tools=tools, messages=messages, dialect="apibank", tools_in_prompt=True)
    return RequestContext(messages=messages)


def template_default_system(tokenizer: Any) -> str | None:
    """The system turn the tokenizer's chat template writes for a conversation without one (Qwen: "You are
    Qwen, created by Alibaba Cloud. ..."), its tool list left out; None when it writes none or has no template."""
    probe = {"type": "function", "function": {"name": "probe", "description": "", "parameters": {"type": "object",
                                                                                                "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[probe], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # no chat template: nothing is added to prompts, nothing to drop
        return None
    for role, content in _TURN.findall(text):
        if role == "system":
            return content.split(_TOOLS_SECTION, 1)[0] or None
    return None


def _openai_tools(specs: Any) -> list[Tool] | None:
    if not isinstance(specs, list) or not specs:
        return None
    try:
        return tools_from_openai(specs)
    except Exception:  # a schema oospec cannot read: draft without it rather than fail the request
        return None


def xargs_with_context(xargs: dict | None, tools: Any, messages: Any, tool_choice: Any = None) -> dict:
    """A request's `vllm_xargs` with its context added under EXTRA_ARGS_KEY (the tool-parser plugin's route).
    A context the client sent itself is kept; a request without tools gets none (nothing to draft from)."""
    out = dict(xargs or {})
    if EXTRA_ARGS_KEY not in out and tools:
        out[EXTRA_ARGS_KEY] = json.dumps({"tools": tools, "messages": messages, "tool_choice": tool_choice,
                                          "dialect": None}, ensure_ascii=False, default=_jsonable)
    return out


def _jsonable(obj: Any) -> Any:
    """vLLM's request objects as plain JSON: pydantic models dumped, lazy iterables (pydantic keeps an
    assistant message's tool_calls as a one-shot iterator) listed."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_none=True)
    if hasattr(obj, "__iter__") and not isinstance(obj, str | bytes):
        return list(obj)
    return str(obj)
