"""How the server runs: every option of `oospec serve`, with its default, in a module light enough for the
command line to read at parse time (the service itself imports the engine)."""

from __future__ import annotations

from dataclasses import dataclass

from oospec.models.registry import DEFAULT_BUDGET, DEFAULT_METHOD, DEFAULT_PREFIX_CACHE_MB


@dataclass
class ServerConfig:
    model_name: str  # the id /v1/models reports and responses carry
    method: str = DEFAULT_METHOD  # oospec needs the sidecar client passed to ModelService (or a ready drafter)
    max_queue: int = 8  # requests waiting behind the running one; more are refused with 429
    request_timeout_s: float = 600.0  # from arrival, queueing included
    default_max_tokens: int = 1024  # when a request gives none (always capped by the context)
    default_temperature: float = 0.0  # OpenAI's default is 1; greedy is this server's, for lossless speed
    prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB  # 0 turns prefix reuse off
    budget: int = DEFAULT_BUDGET  # most draft tokens verified per forward
    api_key: str | None = None
    shutdown_grace_s: float = 30.0
    accept_any_model: bool = False  # False: a request naming another model gets 404, as vLLM answers
    max_body_mb: float = 4.0  # larger request bodies get 413
    body_timeout_s: float = 30.0  # a request body not whole by then gets 408 and its connection is closed
