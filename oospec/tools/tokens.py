"""Between text and the target's token ids: exact bytes per token, and text continuations as draft tokens.

Drafters that reason about text (schema structure, sidecar hints) must hand the verifier token ids of the
target's own tokenizer. Two facts make that subtle: a token can hold part of a UTF-8 character, and BPE
merges across the boundary between what was written and what is proposed (`"` + `,` is one token `",`).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-unicode table, inverted: byte-level BPE token strings back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenBytes:
    """id -> the exact bytes the token adds to the text (b"" for special tokens), memoised."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[int, bytes] = {}
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        vocab_probe = tokenizer.convert_ids_to_tokens(tokenizer.encode(" a", add_special_tokens=False))
        self._byte_level = any(t.startswith("Ġ") for t in vocab_probe)
        self._vocab: list[bytes] | None = None  # every id's bytes, built on the first `starting_with`
        self._starting: dict[bytes, np.ndarray] = {}

    def __call__(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        if token_id in self._special:
            out = b""
        else:
            piece = self.tokenizer.convert_ids_to_tokens(int(token_id))
            if piece is None:
                out = b""
            elif self._byte_level:
                table = _byte_decoder()
                try:
                    out = bytes(table[c] for c in piece)
                except KeyError:  # an added (non-byte-level) token: its text is itself
                    out = piece.encode()
            else:
                m = _BYTE_TOKEN.fullmatch(piece)
                out = bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode()
        self._cache[token_id] = out
        return out

    def join(self, ids) -> bytes:
        return b"".join(self(int(i)) for i in ids)

    def starting_with(self, prefix: bytes) -> np.ndarray:
        """(k,) int64: every token whose bytes begin with `prefix`, ascending (memoised per prefix)."""
        found = self._starting.get(prefix)
        if found is None:
            if self._vocab is None:
                self._vocab = [self(i) for i in range(len(self.tokenizer))]
            found = np.asarray([i for i, b in enumerate(self._vocab) if b.startswith(prefix) and b], dtype=np.int64)
            self._starting[prefix] = found
        return found


class ContinuationEncoder:
    """Turns text that should follow the written tokens into the token ids the target would likely use."""

    def __init__(self, tokenizer, token_bytes: TokenBytes | None = None, tail: int = 3):
        self.tokenizer = tokenizer
        self.token_bytes = token_bytes or TokenBytes(tokenizer)
        self.tail = tail
        self._memo: dict[tuple, np.ndarray] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def continue_after(self, written: np.ndarray, text: str) -> np.ndarray:
        """Token ids for `text` following the `written` ids.

        Re-encode the last few written tokens together with the text; where that reproduces the written
        tokens, the rest is the continuation as the tokenizer would merge it. Where the last written token
        already split a merge (the target wrote `"` alone), encode the text on its own.
        """
        tail_ids = tuple(int(t) for t in written[-self.tail :])
        key = (tail_ids, text)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        tail_text = self.token_bytes.join(tail_ids).decode("utf-8", errors="ignore")
        ids = self.encode(tail_text + text)
        if tuple(ids[: len(tail_ids)]) == tail_ids and len(ids) > len(tail_ids):
            out = np.asarray(ids[len(tail_ids) :], dtype=np.int64)
        else:
            out = np.asarray(self.encode(text), dtype=np.int64)
        if len(self._memo) > 50_000:
            self._memo.clear()
        self._memo[key] = out
        return out
