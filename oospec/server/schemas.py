"""The chat-completions request: validated by hand so that every mistake is a 400 that names the field.

What is accepted (OpenAI's names): messages, tools, tool_choice, max_tokens / max_completion_tokens,
temperature, top_p, seed, stop, stream, stream_options.include_usage, n (1 only), parallel_tool_calls, model
(any name: the server has one model and answers as it). Fields that would change the output in ways this
server cannot honour (penalties, logit_bias, logprobs, response_format other than text, n > 1) are refused
with a 400 rather than silently ignored; other unknown fields are ignored, as OpenAI clients send many.

tool_choice "required" with a single tool is served as that function named (see prompting.py).

One extension, `"oospec": {...}` (with the openai client: `extra_body={"oospec": {...}}`):
  dialect           how the target writes calls, for drafting and parsing (default: hermes)
  tools_in_prompt   the messages already describe the tools: use `tools` for drafting and parsing only
  return_token_ids  add prompt and completion token ids to the response's `oospec` field
  timeout_s         a per-request timeout, at most the server's
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from oospec.errors import SchemaError
from oospec.server.errors import bad_request
from oospec.tools.dialects import DIALECTS
from oospec.tools.schema import Tool, tools_from_openai

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_UNSUPPORTED_NONZERO = ("presence_penalty", "frequency_penalty")


@dataclass
class Options:
    """The `oospec` extension of a request."""

    dialect: str = "hermes"
    tools_in_prompt: bool = False
    return_token_ids: bool = False
    timeout_s: float | None = None


@dataclass
class ChatRequest:
    messages: list[dict]  # role in system/user/assistant/tool, content a string (parts joined), tool_calls parsed
    tools: list[dict] | None = None  # OpenAI tool definitions as given
    tool_schemas: list[Tool] | None = None  # the same tools for drafters and validation
    tool_choice: str = "none"  # "none", "auto", "required" or "function" (then `forced_function` names it)
    forced_function: str | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    parallel_tool_calls: bool = True
    model: str | None = None
    options: Options = field(default_factory=Options)

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tool_schemas or ()]


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_chat_request(body: dict, *, default_temperature: float = 0.0) -> ChatRequest:
    for name in _UNSUPPORTED_NONZERO:
        value = body.get(name)
        if value not in (None, 0, 0.0):
            raise bad_request(f"{name} is not supported by this server (only 0)", name)
    if body.get("logit_bias"):
        raise bad_request("logit_bias is not supported by this server", "logit_bias")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad_request("logprobs are not supported by this server", "logprobs")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request("n must be 1: this server returns one choice", "n")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad_request("response_format other than {\"type\": \"text\"} is not supported", "response_format")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model must be a string", "model")

    tools, schemas = _tools(body.get("tools"))
    tool_choice, forced = _tool_choice(body.get("tool_choice"), schemas)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        tools=tools,
        tool_schemas=schemas,
        tool_choice=tool_choice,
        forced_function=forced,
        max_tokens=_max_tokens(body),
        temperature=_number(body, "temperature", 0.0, 2.0, default_temperature),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, low_open=True),
        seed=_optional_int(body, "seed"),
        stop=_stop(body.get("stop")),
        stream=_bool(body, "stream", False),
        include_usage=bool(_bool(stream_options, "include_usage", False, "stream_options.include_usage")),
        parallel_tool_calls=_bool(body, "parallel_tool_calls", True),
        model=model,
        options=_options(body.get("oospec")),
    )


# --------------------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool(obj: dict, key: str, default: bool, param: str | None = None) -> bool:
    v = obj.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad_request(f"{param or key} must be true or false", param or key)
    return v


def _number(body: dict, key: str, low: float, high: float, default: float, low_open: bool = False) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise bad_request(f"{key} must be a number", key)
    if v > high or v < low or (low_open and v == low):
        raise bad_request(f"{key} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {v}", key)
    return float(v)


def _optional_int(body: dict, key: str) -> int | None:
    v = body.get(key)
    if v is not None and not _is_int(v):
        raise bad_request(f"{key} must be an integer", key)
    return v


def _max_tokens(body: dict) -> int | None:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v) or v < 1:
        raise bad_request(f"{key} must be a positive integer, got {v!r}", key)
    return v


def _stop(v: Any) -> list[str]:
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP:
        raise bad_request(f"stop takes at most {MAX_STOP} strings, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise bad_request("stop strings must not be empty", "stop")
    return stops


def _options(v: Any) -> Options:
    if v is None:
        return Options()
    if not isinstance(v, dict):
        raise bad_request("oospec must be an object", "oospec")
    unknown = set(v) - {"dialect", "tools_in_prompt", "return_token_ids", "timeout_s"}
    if unknown:
        raise bad_request(f"unknown oospec option(s): {', '.join(sorted(unknown))}", "oospec")
    dialect = v.get("dialect", "hermes")
    if dialect not in DIALECTS:
        raise bad_request(f"oospec.dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}", "oospec.dialect")
    timeout = v.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
        raise bad_request("oospec.timeout_s must be a positive number", "oospec.timeout_s")
    return Options(
        dialect=dialect,
        tools_in_prompt=_bool(v, "tools_in_prompt", False, "oospec.tools_in_prompt"),
        return_token_ids=_bool(v, "return_token_ids", False, "oospec.return_token_ids"),
        timeout_s=timeout,
    )


# --------------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------------


def _messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(msg: Any, where: str) -> dict:
    if not isinstance(msg, dict):
        raise bad_request(f"{where} must be an object with role and content", where)
    role = msg.get("role")
    if role not in ROLES:
        raise bad_request(f"{where}.role is {role!r}; expected one of {', '.join(ROLES)}", f"{where}.role")
    if role == "developer":  # OpenAI's newer name for the system role
        role = "system"
    out: dict[str, Any] = {"role": role, "content": _content(msg.get("content"), f"{where}.content")}
    if role == "assistant" and msg.get("tool_calls"):
        out["tool_calls"] = _tool_calls(msg["tool_calls"], f"{where}.tool_calls")
        if out["content"] is None:
            out["content"] = ""
    elif out["content"] is None:
        raise bad_request(f"{where} ({role}) has no content", f"{where}.content")
    if role == "tool":
        if msg.get("tool_call_id") is not None:
            out["tool_call_id"] = str(msg["tool_call_id"])
        if msg.get("name") is not None:
            out["name"] = str(msg["name"])
    return out


def _content(content: Any, where: str) -> str | None:
    """A string; a list of text parts is joined (images and audio are not supported)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}[{j}] is a {kind!r} part; only text parts are supported", f"{where}[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{where} must be a string or a list of text parts", where)


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list", where)
    out = []
    for i, call in enumerate(calls):
        w = f"{where}[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{w} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}", w)
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise bad_request(f"{w}.function.arguments is not valid JSON", f"{w}.function.arguments") from None
        if not isinstance(args, dict):
            raise bad_request(f"{w}.function.arguments must be a JSON object", f"{w}.function.arguments")
        entry = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if call.get("id") is not None:
            entry["id"] = str(call["id"])
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------------


def _tools(tools: Any) -> tuple[list[dict] | None, list[Tool] | None]:
    if tools is None or tools == []:
        return None, None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad_request(f"{where} must be an object of type \"function\"", where)
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_request(f"{where}.function must be an object with a name", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise bad_request(f"{where}.function.name must be 1-64 letters, digits, _ . or -, got {name!r}",
                              f"{where}.function.name")
    try:
        schemas = tools_from_openai(tools)
    except SchemaError as exc:
        raise bad_request(f"invalid tools: {exc}", "tools") from None
    return tools, schemas


def _tool_choice(choice: Any, schemas: list[Tool] | None) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if schemas else "none"), None
    if choice in ("none", "auto", "required"):
        if choice != "none" and not schemas:
            raise bad_request(f"tool_choice {choice!r} needs tools", "tool_choice")
        if choice == "required" and len(schemas) == 1:  # only one function can be called: force its name too
            return "function", schemas[0].name
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        names = [t.name for t in schemas or ()]
        if name not in names:
            raise bad_request(f"tool_choice names function {name!r}, which is not among the tools "
                              f"({', '.join(names) or 'none given'})", "tool_choice")
        return "function", name
    raise bad_request("tool_choice must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
