"""The model behind the server: one engine, one drafter (it learns across requests), one prefix cache."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from oospec.drafters import make_drafter, uses_sidecar
from oospec.engine.decode import Generation
from oospec.engine.drafting import Drafter
from oospec.engine.engine import Engine
from oospec.engine.prefix_cache import PrefixCache
from oospec.errors import OospecError
from oospec.server.config import ServerConfig
from oospec.server.errors import bad_request
from oospec.server.prompting import build_request
from oospec.server.reply import Reply, ReplyBuilder
from oospec.server.schemas import ChatRequest
from oospec.server.worker import Cancelled, Work, Worker, timeout_error
from oospec.tools.dialects import get_dialect

log = logging.getLogger("oospec.server")


@dataclass
class Completion:
    work: Work
    reply: Reply
    generation: Generation
    finish_reason: str
    queue_s: float
    stats: dict


class ModelService:
    def __init__(self, engine: Engine, config: ServerConfig, drafter: Drafter | None = None, sidecar=None):
        self.engine = engine
        self.config = config
        if drafter is None and uses_sidecar(config.method) and sidecar is None:
            raise OospecError(f"method {config.method!r} needs a sidecar: pass sidecar=make_sidecar(...) "
                              "(oospec.sidecar.process), or choose another method (e.g. toolspec)")
        self.drafter = drafter if drafter is not None else make_drafter(
            config.method, **({"sidecar": sidecar} if uses_sidecar(config.method) else {}))
        self.sidecar = sidecar
        self.prefix_cache = PrefixCache(int(config.prefix_cache_mb * 2**20)) if config.prefix_cache_mb > 0 else None
        self.worker = Worker(self.execute, config.max_queue)
        self.started = time.time()
        self.closed = False
        self.shutting_down = False
        self.longest_token_chars = longest_token_chars(engine.tokenizer)

    # -- on the HTTP side ----------------------------------------------------------------------------------

    def prepare(self, req: ChatRequest) -> Work:
        """The prompt and token budget of a request, or a 400 saying why it cannot be served. Templating and
        tokenizing take time (seconds for megabytes), so text that cannot fit is refused before either: no token
        holds more than `longest_token_chars` characters."""
        context = self.engine.target.max_context
        chars = req.text_chars
        if chars > context * self.longest_token_chars:
            raise bad_request(f"the messages have {chars} characters, more than the model's context of {context} "
                              f"tokens can hold", "messages", code="context_length_exceeded")
        request, forced_text = build_request(self.engine, req, default_max_tokens=self.config.default_max_tokens,
                                             budget=self.config.budget)
        return Work(req=req, request=request, forced_text=forced_text, timeout_s=self.timeout_for(req))

    def timeout_for(self, req: ChatRequest) -> float:
        t = self.config.request_timeout_s
        return min(t, req.options.timeout_s) if req.options.timeout_s else t

    # -- on the worker thread --------------------------------------------------------------------------------

    def execute(self, work: Work) -> Completion:
        req, request = work.req, work.request
        reply = ReplyBuilder(self.engine.tokenizer, stops=req.stop, forced_text=work.forced_text,
                             tool_names=[t.name for t in request.tools] if request.tools is not None else None,
                             dialect=get_dialect(request.dialect), parallel_tool_calls=req.parallel_tool_calls,
                             forced_function=req.forced_function)
        if work.emit is not None:
            work.emit(reply.drain())

        def on_tokens(tokens) -> bool:
            stopped = reply.push(tokens)
            if work.emit is not None:
                events = reply.drain()
                if events:
                    work.emit(events)
            return stopped or work.should_stop()

        gen = self.engine.generate(request, drafter=self.drafter, prefix_cache=self.prefix_cache,
                                   on_tokens=on_tokens).generation
        if work.cancel.is_set():
            raise Cancelled()
        if work.expired():
            raise timeout_error(work.timeout_s)
        final = reply.finish()
        if work.emit is not None:
            work.emit(reply.drain())
        if final.tool_calls and final.calls_complete:
            finish_reason = "tool_calls"
        elif final.stopped or gen.finish_reason == "stop":
            finish_reason = "stop"
        else:
            finish_reason = "length"
        queue_s = (work.started_at or work.submitted_at) - work.submitted_at
        stats = self._stats(work, gen, final, queue_s)
        failure = request.constraint.failure if request.constraint is not None else None
        if failure is not None:  # the reply ended where the grammar library could not go on (see constraint.py)
            log.error("request %s: the call grammar failed after %d tokens: %s", work.id, gen.tokens.size, failure)
            stats["grammar_error"] = failure
        return Completion(work, final, gen, finish_reason, queue_s, stats)

    def _stats(self, work: Work, gen: Generation, reply: Reply, queue_s: float) -> dict:
        s = gen.stats
        greedy = s.sampling == "greedy"
        speculative = greedy or s.sampling.startswith("speculative")
        out = {
            "method": self.drafter.name if speculative else "sample",
            # greedy is token-identical to plain greedy; speculative sampling has plain sampling's distribution
            "decoding": "speculative greedy (lossless)" if greedy
            else s.sampling + ("" if speculative else ", no speculation"),
            "target_forwards": s.target_forwards,
            "tau": round(s.tau, 4),
            "new_tokens": s.new_tokens,
            "mean_accepted_per_step": round(s.mean_accepted, 4),
            "prompt_tokens_reused": s.prompt_tokens_reused,
            "queue_s": round(queue_s, 4),
            "prefill_s": round(s.prefill_s, 4),
            "decode_s": round(s.decode_s, 4),
            "draft_s": round(s.draft_s, 4),
            "prefix_cache": self.prefix_cache.as_dict() if self.prefix_cache is not None else None,
        }
        report = drafter_report(self.drafter)
        if report:
            out["drafter"] = report
        if work.req.options.return_token_ids:
            out["prompt_token_ids"] = work.request.prompt_ids.tolist()
            out["completion_token_ids"] = gen.tokens.tolist()
        return out

    # -- status and shutdown ---------------------------------------------------------------------------------

    def health(self) -> dict:
        w = self.worker
        return {
            "status": "shutting down" if self.shutting_down else "ok",
            "model": self.config.model_name,
            "method": self.drafter.name,
            "uptime_s": round(time.time() - self.started, 1),
            "queue": {"waiting": w.waiting, "max": self.config.max_queue, "running": w.running is not None},
            "requests": {"served": w.served, "rejected": w.rejected, "failed": w.failed},
            "prefix_cache": self.prefix_cache.as_dict() if self.prefix_cache is not None else None,
            # null without a sidecar; else its real state (a dead or resting one gives no hints: decoding is then
            # the drafter's other parts, toolspec, until it is back)
            "sidecar": sidecar_health(self.sidecar),
        }

    def begin_shutdown(self) -> None:
        """On SIGTERM/SIGINT, before the HTTP server stops: refuse and drop waiting requests now, and cancel the
        running one if it is still running after the grace period (a stream then ends with an error event)."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self.worker.drain()
        timer = threading.Timer(self.config.shutdown_grace_s, self.worker.cancel_running)
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.worker.close(self.config.shutdown_grace_s)
        if self.sidecar is not None:
            self.sidecar.close()


def sidecar_health(sidecar) -> dict | None:
    """The sidecar's `health()` (oospec.sidecar.process.SidecarClient); stand-ins without one are reported alive."""
    if sidecar is None:
        return None
    health = getattr(sidecar, "health", None)
    return health() if callable(health) else {"state": "alive"}


def drafter_report(drafter: Drafter) -> dict:
    """Per-request reports of a drafter and its parts (e.g. whether the sidecar's hint arrived and was used):
    any part with a `report` (a dataclass with `as_dict`, such as oospec.drafters.sidecar.SidecarReport)."""
    out, seen = {}, set()
    for part in [drafter, *getattr(drafter, "parts", ())]:
        report = getattr(part, "report", None)
        if report is not None and id(report) not in seen:  # a drafter may share its part's
            seen.add(id(report))
            out[part.name] = report.as_dict()
    return out


def longest_token_chars(tokenizer) -> int:
    """The most characters one token stands for (byte-level tokens: bytes, at least as many as characters)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max(len(p) for p in pieces if p is not None)
