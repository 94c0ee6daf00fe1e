"""`retrieval`: propose what the target wrote the last times it answered a similar request.

Agents call the same tools again and again with similar arguments. The memory keeps past (request, output)
pairs, in this process and optionally in a JSONL store that outlives it (text, not token ids, so any target's
tokenizer can use it). Per request, the most similar past requests are picked once; per step, the longest
suffix of what the target has written is looked up in their outputs and what followed is proposed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oospec.drafters.pld import lookup_continuations
from oospec.drafters.priors import ACCEPTANCE
from oospec.engine.drafting import Candidate, Drafter, Request

_WORD = re.compile(r"[A-Za-z0-9_]+")


def request_text(request: Request) -> str:
    """What the user asked: the last user message (earlier turns and system prompts are shared noise)."""
    for msg in reversed(request.messages or []):
        if msg.get("role") == "user" and isinstance(msg.get("content"), str):
            return msg["content"]
    return ""


def words(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in _WORD.findall(text))


@dataclass
class Memory:
    request_words: frozenset[str]
    output_text: str
    tokens: dict[int, np.ndarray]  # tokenizer id -> output token ids, filled on first use


class CallMemory:
    """Past outputs, most recent last; optionally persisted as JSONL lines {"request": ..., "output": ...}."""

    def __init__(self, path: str | Path | None = None, capacity: int = 5000):
        self.path = Path(path) if path else None
        self.capacity = capacity
        self.items: list[Memory] = []
        if self.path and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines()[-capacity:]:
                try:
                    row = json.loads(line)
                    self.items.append(Memory(words(row["request"]), row["output"], {}))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a damaged line costs that entry, never the store

    def add(self, request: str, output: str, tokens: dict[int, np.ndarray] | None = None) -> None:
        """tokens: the output's ids as the target wrote them, by tokenizer id (re-encoding the text could spell an
        added token such as `<tool_call>` otherwise than the target did)."""
        self.items.append(Memory(words(request), output, dict(tokens or {})))
        del self.items[: -self.capacity]
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"request": request, "output": output}, ensure_ascii=False) + "\n")

    def most_similar(self, query: frozenset[str], k: int) -> list[tuple[float, Memory]]:
        scored = []
        for age, item in enumerate(reversed(self.items)):
            union = len(query | item.request_words) or 1
            scored.append((len(query & item.request_words) / union - 1e-6 * age, item))
        scored.sort(key=lambda x: -x[0])
        return scored[:k]


class RetrievalDrafter(Drafter):
    name = "retrieval"

    def __init__(self, memory: CallMemory | None = None, top_k: int = 6, max_ngram: int = 8, draft_len: int = 24,
                 max_branches: int = 3):
        self.memory = memory if memory is not None else CallMemory()
        self.top_k, self.max_ngram, self.draft_len, self.max_branches = top_k, max_ngram, draft_len, max_branches
        self.corpus: list[tuple[float, np.ndarray]] = []

    def start(self, request: Request) -> None:
        self.request = request
        self.tokenizer = request.tokenizer
        self.produced: list[int] = []
        self.corpus = []
        if self.tokenizer is None:
            return
        key = id(self.tokenizer)
        for sim, item in self.memory.most_similar(words(request_text(request)), self.top_k):
            ids = item.tokens.get(key)
            if ids is None:
                ids = item.tokens[key] = np.asarray(
                    self.tokenizer.encode(item.output_text, add_special_tokens=False), dtype=np.int64)
            if ids.size:
                self.corpus.append((sim, ids))

    def observe(self, produced: np.ndarray) -> None:
        self.produced.extend(produced.tolist())

    def finish(self) -> None:
        if self.tokenizer is None or not self.produced:
            return
        out = [t for t in self.produced if t not in self.request.eos_ids]
        self.memory.add(request_text(self.request), self.tokenizer.decode(out, skip_special_tokens=False),
                        {id(self.tokenizer): np.asarray(out, dtype=np.int64)})

    def candidates(self, context: np.ndarray) -> list[Candidate]:
        written = np.asarray(self.produced[-self.max_ngram :], dtype=np.int64)
        if not self.corpus or written.size == 0:
            return []
        found: list[tuple[float, np.ndarray]] = []
        for sim, ids in self.corpus:
            # The longest suffix of what is written that this past output contains, at its first occurrence.
            for cont, n in lookup_continuations(ids, written, max_ngram=self.max_ngram, draft_len=self.draft_len,
                                                max_results=1, latest_first=False):
                found.append((ACCEPTANCE.retrieval(n, sim), cont))
        found.sort(key=lambda x: -x[0])
        out, seen = [], set()
        for conf, cont in found:
            key = cont.tobytes()
            if key not in seen:
                seen.add(key)
                out.append(Candidate(cont, conf, ACCEPTANCE.retrieval_persistence))
            if len(out) >= self.max_branches:
                break
        return out
