"""The chat-completions request and reply as pydantic models (FastAPI validates with them and publishes them in
/openapi.json), and the request as the service reads it (`ChatRequest`).

What is accepted (OpenAI's names): messages, tools, tool_choice, max_tokens / max_completion_tokens,
temperature, top_p, seed, stop, stream, stream_options.include_usage, n (1 only), parallel_tool_calls, model
(checked against the served name by the app unless `--accept-any-model`). Values are taken as JSON gives them
(strict: "5" is not a number, true is not 1). Fields that would change the output in ways this server cannot
honour (penalties, logit_bias, logprobs, response_format other than text, n > 1) are refused with a 400 rather
than silently ignored; other unknown fields are ignored, as OpenAI clients send many.

Sampling values that would break the arithmetic are served as what they mean, not refused:
  * 0 < temperature < 1e-3 is greedy (the lossless speculative path): softmax(logits / T) is then one-hot for
    any logit gap above ~0.03, and float32 overflows to inf/nan below ~1e-36;
  * top_p is raised to at least 1e-6 (a float32 top_p of 1e-300 is 0 and keeps no token): any top_p at or below
    the top token's probability (>= 1/vocabulary) keeps that token alone, so the kept set does not change.

tool_choice "required" with a single tool is served as that function named (see prompting.py).

Text must be Unicode the tokenizer can encode: a string holding a lone surrogate (JSON's "\\ud800" escape, valid
JSON but no Unicode scalar value, so not UTF-8) is refused with a 400 `invalid_unicode` naming the field, in every
field whose text reaches the prompt, the grammar or the reply (messages, tools with their keys, tool_choice,
stop), never repaired: a silent replacement would change what the model reads. Noncharacters and control
characters are valid Unicode and are served as given.

One extension, `"oospec": {...}` (with the openai client: `extra_body={"oospec": {...}}`):
  dialect           how the target writes calls, for drafting and parsing (default: hermes)
  tools_in_prompt   the messages already describe the tools: use `tools` for drafting and parsing only
  return_token_ids  add prompt and completion token ids to the response's `oospec` field
  timeout_s         a per-request timeout, at most the server's
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from oospec.errors import SchemaError
from oospec.server.errors import APIError, bad_request, clip
from oospec.tools.dialects import DEFAULT_DIALECT, DIALECTS
from oospec.tools.schema import Tool, tools_from_openai

MAX_STOP = 4
MAX_MESSAGES = 2048
MAX_TOOLS = 128  # OpenAI's limit
MAX_SCHEMA_DEPTH = 32  # JSON containers nested in a tool's parameters (a schema level is two: object, properties)
GREEDY_BELOW_TEMPERATURE = 1e-3
MIN_TOP_P = 1e-6
FUNCTION_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"

# --------------------------------------------------------------------------------------------------
# The request on the wire
# --------------------------------------------------------------------------------------------------


class Wire(BaseModel):
    """Types as JSON has them; unknown fields are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class ContentPart(Wire):
    """A part of a message's content: only text is supported, and any other type is refused by name (not as a
    mismatch of every member of a union)."""

    type: str
    text: str | None = None


class FunctionCallIn(Wire):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"  # JSON text of an object (OpenAI), or the object itself


class ToolCallIn(Wire):
    id: str | int | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class Message(Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None  # images and audio are not supported
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | int | None = None


class FunctionDef(Wire):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: Any = None  # a JSON Schema object (checked when the tools are read, so that errors name `tools`)
    strict: bool | None = None


class ToolDef(Wire):
    type: Literal["function"] = "function"
    function: FunctionDef
    _given: dict = PrivateAttr(default_factory=dict)  # the definition as sent: the chat template gets it as is

    @model_validator(mode="wrap")
    @classmethod
    def _keep_given(cls, data: Any, handler) -> ToolDef:
        tool = handler(data)
        tool._given = data
        return tool


class FunctionName(Wire):
    name: str


class NamedToolChoice(Wire):
    type: Literal["function"]
    function: FunctionName


class StreamOptions(Wire):
    include_usage: bool | None = None


class ResponseFormat(Wire):
    type: Literal["text"]


class OospecOptions(Wire):
    model_config = ConfigDict(strict=True, extra="forbid")

    dialect: Literal[tuple(DIALECTS)] = DEFAULT_DIALECT  # type: ignore[valid-type]
    tools_in_prompt: bool | None = None
    return_token_ids: bool | None = None
    timeout_s: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)


def _zero_only(name: str):
    def check(v):
        if v not in (None, 0, 0.0):
            raise ValueError(f"{name} is not supported by this server (only 0)")
        return v
    return check


class ChatCompletionRequest(Wire):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    model: str | None = None
    tools: list[ToolDef] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1, le=2**31)
    max_completion_tokens: int | None = Field(None, ge=1, le=2**31)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = Field(None, description="1 only: this server returns one choice")
    response_format: ResponseFormat | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    oospec: OospecOptions | None = None

    _presence = field_validator("presence_penalty")(_zero_only("presence_penalty"))
    _frequency = field_validator("frequency_penalty")(_zero_only("frequency_penalty"))

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v):
        if v:
            raise ValueError("logit_bias is not supported by this server")
        return v

    @field_validator("logprobs", "top_logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v:
            raise ValueError("logprobs are not supported by this server")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else v or []
        if len(stops) > MAX_STOP:
            raise ValueError(f"stop takes at most {MAX_STOP} strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return v


# --------------------------------------------------------------------------------------------------
# The reply on the wire (for /openapi.json; the app builds the same shapes as dicts)
# --------------------------------------------------------------------------------------------------


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # the model's own JSON text, as streamed


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


class ChatCompletion(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    oospec: dict[str, Any] = Field(description="how the reply was decoded: method, tau, timings")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail


# --------------------------------------------------------------------------------------------------
# Validation errors as OpenAI's 400s
# --------------------------------------------------------------------------------------------------


def error_param(loc: tuple) -> str | None:
    """`messages[0].content` from pydantic's location; the union-member tags pydantic adds are dropped."""
    out = ""
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        # else: a union member ("list[TextPart]", "literal['none','auto']"), a JSON position, a function tag
    return out or None


def validation_error(errors: list[dict]) -> APIError:
    """The first of pydantic's (or FastAPI's) errors as a 400 naming the field."""
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    kind, loc = first.get("type", ""), tuple(first.get("loc", ()))
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", first.get("msg", ""))
        return bad_request(f"the request body is not valid JSON: {detail}")
    param = error_param(loc)
    if param is None and kind in ("model_attributes_type", "dict_type", "model_type"):
        return bad_request("the request body must be a JSON object")
    if param and param.startswith("tool_choice"):
        param = "tool_choice"
    msg = clip(first.get("msg", "invalid value").removeprefix("Value error, "), 300)
    return bad_request(f"{param}: {msg}" if param else msg, param)


# --------------------------------------------------------------------------------------------------
# The request as the service reads it
# --------------------------------------------------------------------------------------------------


@dataclass
class Options:
    """The `oospec` extension of a request."""

    dialect: str = DEFAULT_DIALECT
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

    @property
    def text_chars(self) -> int:
        """Characters of message content, all of which the prompt holds: a bound known before templating."""
        return sum(len(m["content"] or "") for m in self.messages)


def parse_chat_request(body: Any, *, default_temperature: float = 0.0) -> ChatRequest:
    """A JSON value (already parsed) to a ChatRequest, or a 400 naming the field."""
    try:
        wire = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None
    return to_chat_request(wire, default_temperature=default_temperature)


def to_chat_request(wire: ChatCompletionRequest, *, default_temperature: float = 0.0) -> ChatRequest:
    """What the field types cannot say: text that is not Unicode, roles and content, tools against tool_choice,
    sampling edge values."""
    check_unicode(wire)
    tools, schemas = _tools(wire.tools)
    tool_choice, forced = _tool_choice(wire.tool_choice, schemas)
    temperature = wire.temperature if wire.temperature is not None else default_temperature
    if temperature < GREEDY_BELOW_TEMPERATURE:
        temperature = 0.0
    options = wire.oospec or OospecOptions()
    max_tokens = wire.max_completion_tokens if wire.max_completion_tokens is not None else wire.max_tokens
    return ChatRequest(
        messages=[_message(m, f"messages[{i}]") for i, m in enumerate(wire.messages)],
        tools=tools,
        tool_schemas=schemas,
        tool_choice=tool_choice,
        forced_function=forced,
        max_tokens=max_tokens,
        temperature=float(temperature),
        top_p=max(float(wire.top_p if wire.top_p is not None else 1.0), MIN_TOP_P),
        seed=wire.seed,
        stop=[wire.stop] if isinstance(wire.stop, str) else list(wire.stop or ()),
        stream=bool(wire.stream),
        include_usage=bool(wire.stream_options and wire.stream_options.include_usage),
        parallel_tool_calls=wire.parallel_tool_calls is not False,
        model=wire.model,
        options=Options(dialect=options.dialect, tools_in_prompt=bool(options.tools_in_prompt),
                        return_token_ids=bool(options.return_token_ids), timeout_s=options.timeout_s),
    )


def check_unicode(wire: ChatCompletionRequest) -> None:
    """A 400 naming the first field whose text (a string or a dict key, at any depth) holds a lone surrogate."""
    fields = {"messages": wire.model_dump(include={"messages"}, exclude_none=True).get("messages"),
              "tools": [t._given for t in wire.tools or ()],
              "tool_choice": wire.tool_choice.model_dump() if isinstance(wire.tool_choice, BaseModel) else None,
              "stop": wire.stop, "model": wire.model}
    for name, value in fields.items():
        refuse_lone_surrogates(value, name)


def refuse_lone_surrogates(value: Any, where: str) -> None:
    found = _surrogate_at(value, where)
    if found is not None:
        where, char = clip(found[0], 200), found[1]
        raise bad_request(f"{where} contains a lone surrogate (U+{ord(char):04X}): text must be valid Unicode; "
                          "send the character's UTF-8 or a pair of surrogates that makes one", where,
                          code="invalid_unicode")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_at(value: Any, where: str) -> tuple[str, str] | None:
    """(the path of the first string or key holding a lone surrogate, that character), or None. JSON decoding
    joins a valid pair into one character, so any surrogate left in a str is a lone one."""
    stack = [(value, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            hit = _SURROGATE.search(node)
            if hit:
                return path, hit.group()
        elif isinstance(node, dict):
            for key, item in reversed(node.items()):
                hit = _SURROGATE.search(key) if isinstance(key, str) else None
                if hit:
                    return f"{path} (a key)", hit.group()
                stack.append((item, f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"))
        elif isinstance(node, list):
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node))))
    return None


def _message(msg: Message, where: str) -> dict:
    role = "system" if msg.role == "developer" else msg.role  # developer: OpenAI's newer name for system
    content = msg.content if not isinstance(msg.content, list) else _text_of_parts(msg.content, where)
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant" and msg.tool_calls:
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(msg.tool_calls)]
        if content is None:
            out["content"] = ""
    elif content is None:
        raise bad_request(f"{where} ({role}) has no content", f"{where}.content")
    if role == "tool":
        if msg.tool_call_id is not None:
            out["tool_call_id"] = str(msg.tool_call_id)
        if msg.name is not None:
            out["name"] = msg.name
    return out


def _text_of_parts(parts: list[ContentPart], where: str) -> str:
    for j, part in enumerate(parts):
        if part.type != "text":
            raise bad_request(f"{where}.content[{j}]: content parts of type {clip(part.type, 40)!r} are not supported "
                              "(this server reads text only)", f"{where}.content[{j}]", code="unsupported_content")
        if part.text is None:
            raise bad_request(f"{where}.content[{j}]: a text part needs a 'text' string", f"{where}.content[{j}].text")
    return "".join(p.text for p in parts)


def _tool_call(call: ToolCallIn, where: str) -> dict:
    args = call.function.arguments
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            raise bad_request(f"{where}.function.arguments is not valid JSON", f"{where}.function.arguments") from None
    if not isinstance(args, dict) or json_depth(args) > MAX_SCHEMA_DEPTH:
        raise bad_request(f"{where}.function.arguments must be a JSON object nested at most {MAX_SCHEMA_DEPTH} deep",
                          f"{where}.function.arguments")
    refuse_lone_surrogates(args, f"{where}.function.arguments")  # escapes inside the JSON text decode to them
    entry = {"type": "function", "function": {"name": call.function.name, "arguments": args}}
    if call.id is not None:
        entry["id"] = str(call.id)
    return entry


def json_depth(value: Any, limit: int = MAX_SCHEMA_DEPTH + 1) -> int:
    """How deep containers nest in a parsed JSON value (counted up to `limit`, so never deeper than that)."""
    depth, level = 0, [value]
    while level and depth < limit:
        level = [v for x in level if isinstance(x, dict | list) for v in (x.values() if isinstance(x, dict) else x)]
        depth += 1
    return depth if not level else limit


def _tools(tools: list[ToolDef] | None) -> tuple[list[dict] | None, list[Tool] | None]:
    if not tools:
        return None, None
    given = [t._given for t in tools]
    for i, tool in enumerate(given):
        if json_depth(tool["function"].get("parameters")) > MAX_SCHEMA_DEPTH:
            raise bad_request(f"tools[{i}].function.parameters nests deeper than {MAX_SCHEMA_DEPTH} levels",
                              f"tools[{i}].function.parameters")
    try:
        schemas = tools_from_openai(given)
    except SchemaError as exc:
        raise bad_request(f"invalid tools: {exc}", "tools") from None
    return given, schemas


def _tool_choice(choice: str | NamedToolChoice | None, schemas: list[Tool] | None) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if schemas else "none"), None
    if isinstance(choice, str):
        if choice != "none" and not schemas:
            raise bad_request(f"tool_choice {choice!r} needs tools", "tool_choice")
        if choice == "required" and len(schemas) == 1:  # only one function can be called: force its name too
            return "function", schemas[0].name
        return choice, None
    name = choice.function.name
    names = [t.name for t in schemas or ()]
    if name not in names:
        raise bad_request(f"tool_choice names function {clip(name)!r}, which is not among the tools "
                          f"({', '.join(names) or 'none given'})", "tool_choice")
    return "function", name
