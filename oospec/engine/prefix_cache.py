"""Prefix reuse: keep the KV cache of earlier requests and start a new request from its longest shared prefix.

On a CPU, prefill is most of a request's time, and consecutive requests of an agent share most of their
prompt (system prompt, tool definitions, earlier turns). After a request, the committed slots (prompt and
output) are copied out of the target's buffers into a bounded, least-recently-used store keyed by their token
ids. A new request copies the longest common prefix back in and prefills only the rest.

Exactness: keys and values depend only on the tokens and their positions, so a restored prefix holds what a
cold prefill computes, up to float rounding: a cold prefill computes the prefix's rows inside one large
matrix product, the original request computed them in its own (possibly differently sized) forwards, and a
GEMM's summation order may depend on the number of rows. Tests compare outputs with cold prefills on
random-initialised models and SmolLM2-135M; see tests/test_prefix_cache.py for what is checked.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from oospec.engine.target import TargetBackend


@dataclass
class Entry:
    tokens: np.ndarray  # (n,) int64 the token ids whose keys and values are held
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (1, kv_heads, n, head_dim)
    nbytes: int = field(init=False)

    def __post_init__(self):
        self.nbytes = sum(k.nbytes + v.nbytes for k, v in self.kv)


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    hits: int = 0  # lookups that reused at least one token
    reused_tokens: int = 0
    prompt_tokens: int = 0  # prompt tokens of every lookup (reused_tokens / prompt_tokens: reuse rate)
    stores: int = 0
    evictions: int = 0

    def as_dict(self) -> dict:
        return {
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.lookups - self.hits,
            "reused_tokens": self.reused_tokens,
            "prompt_tokens": self.prompt_tokens,
            "stores": self.stores,
            "evictions": self.evictions,
        }


def common_prefix_length(rows: Sequence[Sequence[int] | np.ndarray]) -> int:
    """How many leading tokens all `rows` (lists or arrays of token ids) share."""
    n = min(len(r) for r in rows)
    if n == 0:
        return 0
    first = np.asarray(rows[0][:n])
    for row in rows[1:]:
        differ = np.flatnonzero(np.asarray(row[:n]) != first[:n])
        if differ.size:
            n = int(differ[0])
    return n


class PrefixCache:
    """A byte-bounded LRU store of token prefixes and their KV tensors, for one target model.

    min_tokens: shorter shared prefixes are not worth a lookup's copy and are prefilled as usual.
    """

    def __init__(self, max_bytes: int, min_tokens: int = 16):
        self.max_bytes = int(max_bytes)
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self.nbytes = 0
        self.stats = PrefixCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def restore(self, target: TargetBackend, prompt: np.ndarray) -> int:
        """Copy the longest cached prefix of `prompt` into the freshly reset `target`; return its length.

        At least the last prompt token is left to prefill: its logits give the first new token."""
        self.stats.lookups += 1
        self.stats.prompt_tokens += int(prompt.size)
        best_key, best = None, 0
        for key, entry in self._entries.items():
            n = common_prefix_length([entry.tokens, prompt])
            if n > best:
                best_key, best = key, n
        best = min(best, prompt.size - 1)
        if best_key is None or best < self.min_tokens:
            return 0
        self._entries.move_to_end(best_key)
        target.load_prefix(self._entries[best_key].kv, best)
        self.stats.hits += 1
        self.stats.reused_tokens += best
        return best

    def store(self, target: TargetBackend, tokens: np.ndarray) -> None:
        """Keep the target's first len(tokens) committed slots, which hold `tokens`."""
        n = min(int(tokens.size), target.length)
        if n < self.min_tokens:
            return
        if n * target.slot_bytes > self.max_bytes:
            return
        tokens = np.array(tokens[:n], dtype=np.int64)
        for key, entry in list(self._entries.items()):
            shared = common_prefix_length([entry.tokens, tokens])
            if shared == n:  # already held by a longer (or equal) entry
                self._entries.move_to_end(key)
                return
            if shared == entry.tokens.size:  # the new entry extends this one: it replaces it
                self._drop(key)
        while self._entries and self.nbytes + n * target.slot_bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats.evictions += 1
        entry = Entry(tokens, target.save_prefix(n))
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.nbytes += entry.nbytes
        self.stats.stores += 1

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes

    def as_dict(self) -> dict:
        return {"entries": len(self), "bytes": self.nbytes, "max_bytes": self.max_bytes, **self.stats.as_dict()}
