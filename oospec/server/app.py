"""The HTTP surface: OpenAI's /v1/chat/completions and /v1/models, plus /health and /openapi.json.

Every error is an OpenAI-style body ({"error": {message, type, param, code}}): 400 for requests that cannot
be served as given, 401 for a wrong API key, 404 for unknown routes and models not served, 413 for a body over
the size limit, 415 for a body that is not JSON, 429 (with Retry-After) when the queue is full, 503 while
shutting down, 504 past the request timeout, 500 only for a bug. Templating and tokenizing run on worker
threads (PREPARE_AT_ONCE at a time), so that a huge request never holds up the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from contextlib import asynccontextmanager

import anyio
import uvicorn
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from oospec.server.errors import APIError, JSONBody, clip, json_bytes
from oospec.server.guard import APIKeyCheck, BodyGuard, RequestLog
from oospec.server.schemas import ChatCompletion, ChatCompletionRequest, ErrorBody, to_chat_request, validation_error
from oospec.server.service import Completion, ModelService, sidecar_health
from oospec.server.worker import Cancelled, Work

log = logging.getLogger("oospec.server")
_DONE = object()
PREPARE_AT_ONCE = 2  # requests templated and tokenized at the same time, off the event loop
_ERRORS = {status: {"model": ErrorBody} for status in (400, 401, 404, 413, 415, 429, 503, 504)}


def shutting_down() -> APIError:
    return APIError(503, "the request was cancelled: the server is shutting down", type="server_error",
                    code="shutting_down")


class GracefulServer(uvicorn.Server):
    """uvicorn's server, telling the service when shutdown starts (see ModelService.begin_shutdown); exits
    normally after SIGTERM or SIGINT (uvicorn would re-raise the signal once shut down)."""

    def __init__(self, config: uvicorn.Config, service: ModelService):
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig, frame) -> None:
        self.service.begin_shutdown()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
        else:
            self.should_exit = True


def create_app(service: ModelService) -> FastAPI:
    config = service.config

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(service.close)
        w = service.worker
        print(f"oospec serve: shut down (served {w.served}, rejected {w.rejected}, failed {w.failed})",
              file=sys.stderr, flush=True)

    app = FastAPI(title="oospec", summary="OpenAI-compatible chat completions with lossless speculative decoding",
                  lifespan=lifespan, docs_url=None, redoc_url=None, default_response_class=JSONBody)
    app.state.service = service
    prepare_limiter: list[anyio.CapacityLimiter] = []  # made on first use, inside the event loop

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: HTTPRequest, exc: RequestValidationError):
        error = validation_error(list(exc.errors()))
        return JSONBody(error.body(), status_code=error.status)

    @app.exception_handler(APIError)
    async def api_error(request: HTTPRequest, exc: APIError):
        return JSONBody(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: HTTPRequest, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONBody(APIError(exc.status_code, str(exc.detail), type=kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: HTTPRequest, exc: Exception):
        body = APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").body()
        return JSONBody(body, status_code=500)

    # Added innermost first: RequestLog sees every answer, BodyGuard reads only bodies with a valid key.
    app.add_middleware(BodyGuard, max_body_bytes=int(config.max_body_mb * 2**20),
                       body_timeout_s=config.body_timeout_s)
    app.add_middleware(APIKeyCheck, api_key=config.api_key)
    app.add_middleware(RequestLog)

    @app.get("/health")
    async def health():
        return service.health()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(service)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != config.model_name:
            raise APIError(404, f"model {clip(model_id)!r} is not served here (this server serves {config.model_name!r})",
                           type="not_found_error", param="model", code="model_not_found")
        return model_card(service)

    @app.post("/v1/chat/completions", response_model=None, responses={200: {"model": ChatCompletion}, **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: HTTPRequest):
        note = request.scope.get("state", {}).get("oospec", {})
        req = to_chat_request(body, default_temperature=config.default_temperature)
        if req.model is not None and req.model != config.model_name and not config.accept_any_model:
            raise APIError(404, f"The model `{clip(req.model)}` does not exist: this server serves `{config.model_name}`.",
                           param="model", code="model_not_found")
        if not prepare_limiter:
            prepare_limiter.append(anyio.CapacityLimiter(PREPARE_AT_ONCE))
        work = await anyio.to_thread.run_sync(service.prepare, req, limiter=prepare_limiter[0])
        note.update(id=work.id, method=config.method, prompt_tokens=int(work.request.prompt_ids.size))
        if service.sidecar is not None:  # the log line says whether this request could have had hints
            note["sidecar"] = sidecar_health(service.sidecar)["state"]
        if req.stream:
            return await _stream(service, work, request, note)
        service.worker.submit(work)
        completion = await _wait(work, request)
        note_completion(note, completion)
        return completion_body(service, completion)

    return app


async def _wait(job: Work, request: HTTPRequest) -> Completion:
    """The job's result; cancels it when the client goes away or its time is up."""
    future = asyncio.wrap_future(job.future)
    try:
        while True:
            left = job.deadline - time.monotonic()
            done, _ = await asyncio.wait({future}, timeout=max(0.0, min(1.0, left)))
            if done:
                try:
                    return future.result()
                except Cancelled:
                    raise shutting_down() from None
            if left <= 0:
                job.cancel.set()
                future.cancel()  # nobody will read its outcome
                raise APIError(504, f"the request did not finish within the server's {job.timeout_s:g} s timeout",
                               type="timeout_error", code="timeout")
            if await request.is_disconnected():
                job.cancel.set()
                future.cancel()
                raise APIError(499, "the client closed the request", code="client_closed_request")
    except asyncio.CancelledError:
        job.cancel.set()
        future.cancel()
        raise


def note_completion(note: dict, c: Completion) -> None:
    """What the request's log line says about the generation."""
    s = c.stats
    note.update(cached=s["prompt_tokens_reused"], new=s["new_tokens"], path=s["method"], tau=s["tau"],
                finish=c.finish_reason)


async def _stream(service: ModelService, work: Work, request: HTTPRequest,
                  note: dict) -> StreamingResponse:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    work.emit = lambda evs: loop.call_soon_threadsafe(events.put_nowait, evs)
    service.worker.submit(work)  # before the response starts, so that 429 and 503 are real statuses
    work.future.add_done_callback(lambda _: loop.call_soon_threadsafe(events.put_nowait, _DONE))
    chunks = ChunkWriter(service, work)

    async def body():
        try:
            yield sse(chunks.role())
            while True:
                left = work.deadline - time.monotonic()
                try:
                    item = await asyncio.wait_for(events.get(), timeout=max(0.01, left))
                except TimeoutError:
                    work.cancel.set()
                    yield sse(APIError(504, "the request timed out", type="timeout_error", code="timeout").body())
                    break
                if item is _DONE:
                    exc = work.future.exception()
                    if exc is not None:
                        error = exc if isinstance(exc, APIError) else shutting_down()
                        yield sse(error.body())
                    else:
                        note_completion(note, work.future.result())
                        for chunk in chunks.final(work.future.result()):
                            yield sse(chunk)
                    break
                for chunk in chunks.deltas(item):
                    yield sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            work.cancel.set()  # a client that went away stops the generation at its next step

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def sse(obj: dict) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


# --------------------------------------------------------------------------------------------------
# Response bodies
# --------------------------------------------------------------------------------------------------


def model_card(service: ModelService) -> dict:
    return {"id": service.config.model_name, "object": "model", "created": int(service.started),
            "owned_by": "oospec"}


def usage(c: Completion) -> dict:
    prompt = int(c.work.request.prompt_ids.size)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": c.reply.completion_tokens,
        "total_tokens": prompt + c.reply.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.generation.stats.prompt_tokens_reused},
    }


def completion_body(service: ModelService, c: Completion) -> dict:
    message: dict = {"role": "assistant", "content": c.reply.content}
    if c.reply.tool_calls:
        message["tool_calls"] = c.reply.tool_calls
    return {
        "id": c.work.id,
        "object": "chat.completion",
        "created": c.work.created,
        "model": service.config.model_name,
        "choices": [{"index": 0, "message": message, "finish_reason": c.finish_reason, "logprobs": None}],
        "usage": usage(c),
        "oospec": c.stats,
    }


class ChunkWriter:
    """OpenAI `chat.completion.chunk` objects for one streamed reply."""

    def __init__(self, service: ModelService, work: Work):
        self.base = {"id": work.id, "object": "chat.completion.chunk", "created": work.created,
                     "model": service.config.model_name}
        self.include_usage = work.req.include_usage

    def chunk(self, delta: dict, finish_reason: str | None = None, **extra) -> dict:
        return {**self.base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                          "logprobs": None}], **extra}

    def role(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""})

    def deltas(self, events: list[tuple]) -> list[dict]:
        """One chunk per run of content events and per tool-call event, in order (a step that accepted
        several tokens gives one chunk with all their text)."""
        merged: list[list] = []
        for ev in events:
            if ev[0] == "content" and merged and merged[-1][0] == "content":
                merged[-1][1] += ev[1]
            elif ev[0] == "args" and merged and merged[-1][0] == "args" and merged[-1][1] == ev[1]:
                merged[-1][2] += ev[2]
            else:
                merged.append(list(ev))
        out: list[dict] = []
        for ev in merged:
            if ev[0] == "content":
                out.append(self.chunk({"content": ev[1]}))
            elif ev[0] == "call":
                _, index, call_id, name = ev
                out.append(self.chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                                       "function": {"name": name, "arguments": ""}}]}))
            else:
                _, index, fragment = ev
                out.append(self.chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}))
        return out

    def final(self, c: Completion) -> list[dict]:
        out = [self.chunk({}, c.finish_reason, oospec=c.stats)]
        if self.include_usage:
            out.append({**self.base, "choices": [], "usage": usage(c)})
        return out
