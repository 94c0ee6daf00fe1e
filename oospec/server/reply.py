"""From generated token ids to an OpenAI reply: text deltas, stop strings, and tool calls (whole or streamed).

The same `ReplyBuilder` serves both modes. Tokens go in step by step (several per step when a step accepts
several); text comes out as soon as it is complete UTF-8, cut before the first stop string. In a streamed
reply, `events` says what to send: content, or a tool call's start (id, name) and fragments of its arguments
as they are written. The final message (`finish`) is parsed from the whole text with the rules below, and a
stream's events end consistent with it.

Tool calls are read from the reply (when tools were offered and tool_choice is not none):
  * if the reply contains `<tool_call>`, everything from the first one on is the call region: every
    `{"name": ..., "arguments"|"parameters": {...}}` object in it is a call; the text before it, if not blank,
    is the message content;
  * otherwise, a reply that is only JSON (possibly fenced) naming offered tools is a call (plain JSON, Llama
    style, or pythonic `[f(a=1)]` for that dialect);
  * otherwise the reply is content.
Arguments are the model's own JSON text (whitespace, key order and duplicated keys as it wrote them), the same
streamed and not streamed, as OpenAI-compatible servers return them; arguments it wrote as a JSON string are
that string's content; arguments it wrote as another JSON value (`17`) are that value's text, still a call (the
client sees what the model wrote; arguments are not guaranteed to be an object). Arguments that reach the end
of the reply without a whole JSON value are a cut-off call (`complete=False`, finish_reason "length").

A whole call that repeats an earlier one of the same reply (the same function, arguments of equal value) is
dropped, and the reply ends there: a model that writes the same call twice at temperature 0 would go on
repeating it until max_tokens. With `parallel_tool_calls: false` a reply has at most one call (the first); a
forced call of a named function is one call, and `required` allows several (see oospec.server.prompting).

Only offered functions are called. Calls are read in order and end at the first call to a function
that was not offered: a reply whose first call names one is text (content), never a call; calls before it are
kept and it and what follows are dropped, as a stream has already sent those calls. A JSON-only reply is a call
only when every object in it names an offered function. This holds whatever tool_choice was: a reply forced to
call (required, named) that calls no offered function ends as content with finish_reason "stop" (or "length"
when it was cut off), the model's own text: the reply start the server forced is never returned as content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

from oospec.tools.dialects import CALL_HEADER, CALL_TAG, Dialect, ToolCall, extract_json_calls, header_name
from oospec.tools.jsonscan import JsonScanner

_DECODER = json.JSONDecoder()
_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.S)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


# --------------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------------


class Detokenizer:
    """Token ids in, text deltas out; a delta is withheld while it ends inside a multi-byte character.

    Decodes a short window (the tokens since the last emitted delta, plus the ones before it) instead of
    the whole reply, as vLLM does."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the window
        self._read = 0  # tokens whose text has been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return now[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still withheld (an incomplete character at the end of a cut-off reply)."""
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return now[len(before):]


class StopMatcher:
    """Cuts text before the first stop string, holding back a tail that may be the start of one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The text that is safe to pass on, and whether a stop string was found (nothing follows it)."""
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
        keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


# --------------------------------------------------------------------------------------------------
# Tool calls in a finished reply
# --------------------------------------------------------------------------------------------------


@dataclass
class CallOut:
    """A call as the reply carries it."""

    name: str
    arguments: str  # JSON text of the arguments object; for a cut-off call, the part the model wrote
    complete: bool = True

    @classmethod
    def of(cls, call: ToolCall) -> CallOut:
        return cls(call.name, json.dumps(call.arguments, ensure_ascii=False))


def parse_reply(text: str, tool_names: list[str] | None, dialect: Dialect,
                forced_function: str | None = None, forced: str = "") -> tuple[str | None, list[CallOut]]:
    """(content, calls) of a finished reply; tool_names None: tools were not offered, the text is content.

    forced_function: the reply was forced to start calling this function (tool_choice), so a reply without
    `<tool_call>` is still read call by call. forced: the start of `text` the server forced; content never
    holds it."""
    if tool_names is None:
        return text, []
    at = text.find(CALL_TAG)
    if at >= 0:
        calls = offered(calls_in_region(text, at), tool_names)
        if calls:
            content = text[:at].rstrip()
            return (content if content.strip() else None), calls
        return model_text(text, forced), []
    calls = [CallOut.of(c) for c in json_only_calls(text, dialect)]
    if calls and all(c.name in tool_names for c in calls):
        return None, calls
    if forced_function and not calls:
        calls = offered(calls_in_region(text, 0), tool_names)
        if calls:
            return None, calls
    return model_text(text, forced), []


def offered(calls: list[CallOut], tool_names: list[str]) -> list[CallOut]:
    """The calls before the first one to a function that was not offered."""
    for i, call in enumerate(calls):
        if call.name not in tool_names:
            return calls[:i]
    return calls


def model_text(text: str, forced: str) -> str | None:
    """A reply read as content: what the model wrote after the start the server forced (None: nothing)."""
    if not forced or not text.startswith(forced):
        return text
    return text[len(forced):] or None


def calls_in_region(text: str, start: int) -> list[CallOut]:
    """The calls after `start`, read as the stream reads them: each `{"name": ..., "arguments": ` header, then
    its arguments value, whether or not the model closes the object around it. Arguments that do not parse
    are returned as written (as OpenAI does: arguments are not guaranteed to be valid JSON); a last call cut
    off before its arguments close is returned incomplete. Replies in other shapes (keys in another order)
    fall back to the dialects' lenient JSON extraction."""
    calls: list[CallOut] = []
    cursor = start
    while (header := CALL_HEADER.search(text, cursor)) is not None:
        name, at = header_name(header), header.end()
        if text.startswith("{", at):
            end = JsonScanner().feed(text[at:])
            if end is None:
                calls.append(CallOut(name, text[at:], complete=False))
                break
            calls.append(CallOut(name, text[at:at + end]))
            cursor = at + end
            continue
        if not text[at:].strip():  # cut off right after the header (max_tokens): a call with no arguments yet
            calls.append(CallOut(name, "", complete=False))
            break
        try:
            value, end = _DECODER.raw_decode(text, at)
        except ValueError:
            break
        if isinstance(value, str) and isinstance(_json_or_none(value), dict):
            calls.append(CallOut(name, value))  # arguments written as a JSON string holding the object
        else:  # another JSON value: the model's own text; at the very end of the text it may go on (1 -> 17)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            calls.append(CallOut(name, text[at:end], complete=not (number and end == len(text))))
        cursor = end
    return calls or [CallOut.of(c) for c in extract_json_calls(text[start:])]


def _json_or_none(raw: str):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # (a reply can nest deeper than Python's json parser recurses)
        return None


def json_only_calls(text: str, dialect: Dialect) -> list[ToolCall]:
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    if dialect.name == "pythonic" and body.startswith("["):
        return dialect.parse(body)
    if not body.startswith(("{", "[")):
        return []
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return []
    objs = obj if isinstance(obj, list) else [obj]
    calls = extract_json_calls(json.dumps(objs))
    return calls if len(calls) == len(objs) else []


def openai_tool_call(call: CallOut, call_id: str | None = None) -> dict:
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


# --------------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------------


@dataclass
class _StreamedCall:
    id: str
    name: str
    scanned: int  # the reply text up to here has been scanned for the arguments' end (and sent)
    end: JsonScanner = field(default_factory=JsonScanner)  # where the arguments object ends
    done: bool = False
    held: bool = False  # a call after the first: announced only once whole and not a repeat
    start: int = 0  # where its arguments begin


def call_key(name: str, arguments: str) -> tuple[str, str]:
    """What makes two calls the same call: the function and the arguments' value (not their layout)."""
    try:
        return name, json.dumps(json.loads(arguments), sort_keys=True)
    except (ValueError, RecursionError):
        return name, arguments


def without_repeats(calls: list[CallOut]) -> list[CallOut]:
    """`calls` without any whole call equal to an earlier one (`call_key`)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for call in calls:
        key = call_key(call.name, call.arguments)
        if call.complete and key in seen:
            continue
        seen.add(key)
        out.append(call)
    return out


class ToolCallStream:
    """Turns growing reply text into OpenAI stream events:
    ("content", text), ("call", index, id, name), ("args", index, fragment)."""

    def __init__(self, tool_names: list[str] | None, dialect: Dialect, parallel: bool = True,
                 forced_function: str | None = None, forced: str = ""):
        self.tool_names = tool_names
        self.forced_function = forced_function
        self.forced = forced  # the reply start the server forced: never sent as content
        self.dialect = dialect
        self.parallel = parallel
        self.text = ""
        self.sent = 0  # content characters sent
        self.mode = "content" if tool_names is not None else "plain"  # then "calls" or "held" (JSON-only reply)
        self.cursor = 0  # where to look for the next call header
        self.calls: list[_StreamedCall] = []
        self.blocked = False  # a call whose arguments cannot be streamed: it and later calls are sent at the end
        self.seen: set[tuple[str, str]] = set()  # `call_key` of every whole call sent
        self.repeated = False  # a whole call repeated an earlier one: the reply has said all it will

    def feed(self, delta: str) -> list[tuple]:
        self.text += delta
        events: list[tuple] = []
        if self.mode == "plain":
            events += self._send_content(len(self.text))
        if self.mode == "content":
            at = self.text.find(CALL_TAG)
            if at >= 0:
                events += self._send_content(len(self.text[:at].rstrip()))
                self.mode, self.cursor = "calls", at
            elif self.text.strip()[:1] in ("{", "[", "`") and self.sent == 0:
                self.mode = "held"  # a JSON-only reply is a call or content: known only at the end
            else:
                events += self._send_content(self._content_safe_end())
        if self.mode == "calls":
            events += self._stream_calls()
        return events

    def finish(self) -> tuple[str | None, list[CallOut], list[str], list[tuple]]:
        """The final content, calls and call ids, and the events that make the stream agree with them."""
        content, calls = parse_reply(self.text, self.tool_names, self.dialect, self.forced_function, self.forced)
        calls = without_repeats(calls)
        if not self.parallel:
            calls = calls[:1]
        self.calls = [c for c in self.calls if c.done or not c.held]  # a later call cut off was never announced
        events: list[tuple] = []
        if self.mode in ("plain", "content") or (not calls and not self.calls):
            if not calls and self.forced and self.text.startswith(self.forced):
                self.sent = max(self.sent, len(self.forced))  # (nothing of it was sent: it opens a call region)
            events += self._send_content(len(self.text))  # (a call region that holds no call is content)
        ids = [c.id for c in self.calls[: len(calls)]]
        for i, call in enumerate(calls[len(self.calls):], start=len(self.calls)):
            ids.append(new_call_id())
            events.append(("call", i, ids[-1], call.name))
            events.append(("args", i, call.arguments))
        return content, calls, ids, events

    def _content_safe_end(self) -> int:
        """Send up to the last non-blank character, and not a tail that may be the start of `<tool_call>`."""
        text = self.text
        end = len(text.rstrip())
        for k in range(len(CALL_TAG) - 1, 0, -1):
            if text.endswith(CALL_TAG[:k]):
                end = min(end, len(text[: len(text) - k].rstrip()))
                break
        return end

    def _send_content(self, end: int) -> list[tuple]:
        if end <= self.sent:
            return []
        piece, self.sent = self.text[self.sent:end], end
        return [("content", piece)]

    def _stream_calls(self) -> list[tuple]:
        """The first call is streamed as it is written; each later one is sent whole once its arguments close,
        unless it repeats an earlier call (then it is dropped and `repeated` is set)."""
        events: list[tuple] = []
        while True:
            if self.calls and not self.calls[-1].done:
                call = self.calls[-1]
                index = len(self.calls) - 1
                end = call.end.feed(self.text[call.scanned:])
                stop = len(self.text) if end is None else call.scanned + end
                if stop > call.scanned and not call.held:
                    events.append(("args", index, self.text[call.scanned:stop]))
                call.scanned = stop
                if end is None:
                    return events
                call.done = True
                self.cursor = stop
                key = call_key(call.name, self.text[call.start:stop])
                if call.held and key in self.seen:
                    self.calls.pop()
                    self.repeated = True
                    return events
                self.seen.add(key)
                if call.held:
                    events += [("call", index, call.id, call.name), ("args", index, self.text[call.start:stop])]
            if self.blocked or (self.calls and not self.parallel):
                return events
            header = CALL_HEADER.search(self.text, self.cursor)
            if header is None or header.end() >= len(self.text):
                return events
            if self.text[header.end()] != "{":  # arguments as a JSON string: sent whole at the end
                self.blocked = True
                return events
            name = header_name(header)
            if name not in self.tool_names:  # not offered: never announced; the final parse ends the calls here
                self.blocked = True
                return events
            call = _StreamedCall(new_call_id(), name, header.end(), held=bool(self.calls), start=header.end())
            self.calls.append(call)
            if not call.held:
                events.append(("call", len(self.calls) - 1, call.id, name))


# --------------------------------------------------------------------------------------------------
# The reply
# --------------------------------------------------------------------------------------------------


@dataclass
class Reply:
    text: str  # the reply's text (forced start included), cut before a stop string
    content: str | None
    tool_calls: list[dict]  # OpenAI tool_calls entries
    calls_complete: bool  # False: the last call was cut off (its arguments are not complete JSON)
    completion_tokens: int  # generated tokens up to the one that completed a stop string
    stopped: bool  # a stop string ended it, or a call that repeated an earlier one


class ReplyBuilder:
    """Generated tokens in (`push`, step by step), stream events out (`events`), the final reply (`finish`).

    forced_text: the start of the reply the prompt forced (tool_choice); it is part of the text and parsed
    with it, but stop strings apply to generated text only.
    tool_names: the offered tools, or None when the reply is not parsed for calls."""

    def __init__(self, tokenizer, *, stops: list[str], forced_text: str = "", tool_names: list[str] | None,
                 dialect: Dialect, parallel_tool_calls: bool = True, forced_function: str | None = None):
        self.detok = Detokenizer(tokenizer)
        self.stop = StopMatcher(stops)
        self.calls = ToolCallStream(tool_names, dialect, parallel_tool_calls, forced_function, forced_text)
        self.tokens = 0
        self.stopped = False
        self.events: list[tuple] = self.calls.feed(forced_text) if forced_text else []

    def push(self, tokens) -> bool:
        """Take the tokens of one step; True once a stop string has ended the reply (later tokens are ignored)."""
        for token in tokens:
            if self.stopped:
                break
            self.tokens += 1
            text, self.stopped = self.stop.feed(self.detok.push(int(token)))
            if text:
                self.events += self.calls.feed(text)
                self.stopped = self.stopped or self.calls.repeated  # a repeated call: nothing new will follow
        return self.stopped

    def drain(self) -> list[tuple]:
        events, self.events = self.events, []
        return events

    def finish(self) -> Reply:
        if not self.stopped:
            rest, self.stopped = self.stop.feed(self.detok.flush())
            rest += "" if self.stopped else self.stop.flush()
            if rest:
                self.events += self.calls.feed(rest)
        content, calls, ids, events = self.calls.finish()
        self.events += events
        tool_calls = [openai_tool_call(c, i) for c, i in zip(calls, ids)]
        return Reply(text=self.calls.text, content=content, tool_calls=tool_calls,
                     calls_complete=all(c.complete for c in calls), completion_tokens=self.tokens, stopped=self.stopped)
