"""Errors the server answers with, in OpenAI's error shape: {"error": {message, type, param, code}}."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


ECHO_CHARS = 100  # the most of a client's string an error message repeats


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """A client's string as an error message may quote it: at most `limit` characters, then "…" (a 200 KB model
    name is not sent back whole)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "…"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def json_bytes(content: Any, **dumps: Any) -> bytes:
    """JSON as UTF-8, where a lone surrogate in a string (a client's, quoted back) is written as its JSON escape
    (\\udXXX) instead of failing to encode: no answer can turn into a 500 over the text it quotes."""
    return json.dumps(content, ensure_ascii=False, **dumps).encode("utf-8", "backslashreplace")


class JSONBody(JSONResponse):
    """Every JSON answer of the server: `json_bytes`."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content, allow_nan=False, separators=(",", ":"))  # as starlette's JSONResponse
