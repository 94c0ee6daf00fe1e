"""What a request must pass before the app reads it, and the line it leaves in the log.

Plain ASGI middleware (streaming is untouched), outermost first:
  RequestLog   one log line per request: id, status, seconds, prompt / cached / new tokens, decoding path, tau;
  APIKeyCheck  `Authorization: Bearer <key>` on every route but /health (401);
  BodyGuard    a body says it is JSON (415 naming what is wrong: no Content-Type, or another type; FastAPI
               would not read a body without one as JSON and answer that it is not an object), arrives whole
               within `body_timeout_s` (408, then the connection is closed: a client that sends headers and
               stops is not waited on for ever), is at most `max_body_bytes` (413), nested at most
               MAX_JSON_DEPTH deep (400: Python's json parser would recurse once per level).
A body that is refused is still read to its end (up to DRAIN_LIMIT and the body timeout, then the connection is
closed), so that a client still sending it gets the answer rather than a reset connection.

`HeaderTimeoutH11` closes connections that do not finish their request headers in time (uvicorn times out only
idle keep-alive connections after a response, not a socket that never sends a request).
"""

from __future__ import annotations

import hmac
import json
import logging
import time

import anyio
import numpy as np
from uvicorn.protocols.http.h11_impl import H11Protocol

from oospec.server.errors import APIError, JSONBody, bad_request, clip

log = logging.getLogger("oospec.server")

MAX_JSON_DEPTH = 64
DRAIN_LIMIT = 256 * 2**20
SCAN_CHUNK = 2**20
_OPEN, _CLOSE, _QUOTE, _BACKSLASH = 1, 2, 3, 4
_KIND = np.zeros(256, dtype=np.uint8)
_KIND[list(b"[{")], _KIND[list(b"]}")], _KIND[ord('"')], _KIND[ord("\\")] = _OPEN, _CLOSE, _QUOTE, _BACKSLASH


def json_depth(raw: bytes, chunk_bytes: int = SCAN_CHUNK) -> int:
    """How deep arrays and objects nest in JSON text, without parsing it: linear time, brackets inside strings
    skipped (a quote opens or closes a string unless an odd run of backslashes precedes it; outside strings a
    backslash is invalid JSON, which the parser refuses before it could nest deeper). Scanned a chunk at a time,
    a few numpy passes over the chunk's brackets, quotes and backslashes, so that the thread checking a 20 MB
    body never holds the interpreter long (one regular-expression pass over it kept the event loop ~0.2 s)."""
    peak = 0
    for _, _, levels, _ in _marks(raw, chunk_bytes):
        if levels.size:
            peak = max(peak, int(levels.max()))
    return peak


def _marks(raw: bytes, chunk_bytes: int = SCAN_CHUNK):
    """Per chunk: (offsets of its brackets, quotes and backslashes; their kinds; the nesting level after each;
    whether each leaves the scan outside a string), offsets into `raw`."""
    data = np.frombuffer(raw, dtype=np.uint8)
    depth = 0
    in_string, odd_run = 0, False  # carried between chunks: inside a string?, odd backslash run at the end?
    for start in range(0, data.size, chunk_bytes):
        kinds = _KIND[data[start:start + chunk_bytes]]
        at = np.flatnonzero(kinds)
        kind = kinds[at]
        if odd_run:  # the previous chunk's run, as one backslash just before this chunk
            at, kind = np.concatenate(([-1], at)), np.concatenate(([_BACKSLASH], kind))
        is_quote = kind == _QUOTE
        backslash = kind == _BACKSLASH
        run_before = np.zeros(kind.size, dtype=np.int64)
        if backslash.any():  # each mark's count of backslashes right before it: the distance to its run's start
            index = np.arange(kind.size)
            continues = np.concatenate(([False], backslash[:-1] & (np.diff(at) == 1)))
            run_before = index - np.maximum.accumulate(np.where(continues, 0, index))
            is_quote &= run_before % 2 == 0
        outside = (np.cumsum(is_quote) + in_string) % 2 == 0
        steps = (kind == _OPEN).astype(np.int64) - (kind == _CLOSE)
        levels = depth + np.cumsum(np.where(outside, steps, 0))
        if levels.size:
            depth, in_string = int(levels[-1]), int(not outside[-1])
        yield at + start, np.where(is_quote, _QUOTE, np.where(kind == _QUOTE, 0, kind)), levels, outside
        ends_in_run = kind.size > 0 and backslash[-1] and at[-1] == kinds.size - 1
        odd_run = bool(ends_in_run and run_before[-1] % 2 == 0)


def too_deep_field(raw: bytes, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The top-level key of the body's object under which nesting first goes deeper than `limit` (None: the body
    is not an object, or the key cannot be read)."""
    key_at = None
    for at, kind, levels, outside in _marks(raw):
        over = np.flatnonzero(levels > limit)
        end = over[0] if over.size else levels.size
        # a string opening at level 1 (its quote leaves the scan inside a string) whose previous non-blank byte
        # is `{` or `,` is a top-level key
        opening = np.flatnonzero((kind[:end] == _QUOTE) & ~outside[:end] & (levels[:end] == 1))
        for i in opening[::-1]:
            before = raw[max(0, at[i] - 64):at[i]].rstrip()
            if before[-1:] in (b"{", b","):
                key_at = int(at[i])
                break
        if over.size:
            break
    if key_at is None:
        return None
    try:
        return json.decoder.scanstring(raw[key_at + 1:key_at + 1 + 4 * 256].decode("utf-8", "replace"), 0)[0]
    except ValueError:
        return None


def check_json_body(raw: bytes) -> None:
    if json_depth(raw) > MAX_JSON_DEPTH:
        field = too_deep_field(raw)
        where = clip(field, 60) if field is not None else None
        raise bad_request(f"{where or 'the request body'} nests deeper than {MAX_JSON_DEPTH} levels", where,
                          code="json_too_deep")


def content_type_error(content_type: str) -> APIError | None:
    """The 415 for a body that does not say it is JSON, naming what it says instead; None for JSON."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    said = "has no Content-Type header" if not media else f"has Content-Type {clip(content_type.strip(), 60)!r}"
    return APIError(415, f"the request {said}: send the JSON body with Content-Type: application/json",
                    code="unsupported_media_type")


async def _answer(exc: APIError, scope, receive, send) -> None:
    await JSONBody(exc.body(), status_code=exc.status, headers=exc.headers)(scope, receive, send)


async def _drain(receive, more: bool, limit: int = DRAIN_LIMIT) -> bool:
    """Read and drop the rest of a body; False when it ran past `limit` (the connection should then close)."""
    seen = 0
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return True
        seen += len(message.get("body", b""))
        more = message.get("more_body", False)
        if seen > limit:
            return False
    return True


class BodyGuard:
    def __init__(self, app, max_body_bytes: int, body_timeout_s: float = 30.0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        # One deadline for the whole body, refused or read: a client that stops sending is answered 408 and cut off.
        try:
            with anyio.fail_after(self.body_timeout_s):
                body = await self._read(headers, receive)
        except TimeoutError:
            late = APIError(408, f"the request body did not arrive within {self.body_timeout_s:g} s",
                            code="request_timeout", headers={"Connection": "close"})
            return await _answer(late, scope, receive, send)
        except APIError as exc:
            return await _answer(exc, scope, receive, send)
        if body is None:  # the client went away
            return
        try:
            await anyio.to_thread.run_sync(check_json_body, body)
        except APIError as exc:
            return await _answer(exc, scope, receive, send)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()  # after the body: wait for the client to go away
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, headers: dict, receive) -> bytes | None:
        """The whole body (None: the client went away), or the APIError that refuses it once it is drained."""
        limit = self.max_body_bytes
        refused = content_type_error(headers.get(b"content-type", b"").decode("latin-1"))
        if refused is not None:
            await _drain(receive, True)
            raise refused
        too_big = APIError(413, f"the request body is larger than this server's limit of {limit / 2**20:g} MB",
                           code="request_too_large", headers={"Connection": "close"})
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await _drain(receive, True)
            raise too_big
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > limit:
                chunks.clear()
                await _drain(receive, more)
                raise too_big
        return b"".join(chunks)


class APIKeyCheck:
    """`Authorization: Bearer <key>` (the scheme's name in any case, RFC 7235) on every route but /health."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health" and self.api_key:
            headers = dict(scope.get("headers") or ())
            try:
                check_api_key(self.api_key, headers.get(b"authorization", b"").decode("latin-1"))
            except APIError as exc:
                return await _answer(exc, scope, receive, send)
        await self.app(scope, receive, send)


def check_api_key(api_key: str | None, authorization: str | None) -> None:
    if not api_key:
        return
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                       type="authentication_error", code="invalid_api_key")


class RequestLog:
    """One line per request to the API (not /health): what the endpoint noted in scope["state"]["oospec"]."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [0]
        note = scope.setdefault("state", {}).setdefault("oospec", {})

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            fields = " ".join(f"{k}={v}" for k, v in note.items())
            log.info("%s %s %s %.3fs %s", scope["method"], scope["path"], status[0] or "-",
                     time.monotonic() - start, fields)


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request's headers do not arrive within
    `header_timeout_s` of the connection opening or the previous response ending."""

    header_timeout_s = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        waiting_on = self.cycle  # a request whose headers arrive replaces it
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()

        def expire():
            if self.cycle is waiting_on and not self.transport.is_closing():
                self.transport.close()

        self._header_timer = self.loop.call_later(self.header_timeout_s, expire)


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutH11]:
    """The protocol class to give uvicorn (`uvicorn.Config(http=...)`) for a header-read timeout of `seconds`."""
    return type("HeaderTimeoutH11", (HeaderTimeoutH11,), {"header_timeout_s": seconds})
