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


def encode_plain(tokenizer, text: str) -> list[int]:
    """`text` through the tokenizer's pipeline without its added tokens: `<tool_call>` as the characters it is
    made of, not the control token (no shared flag is set: a server tokenizes on more than one thread)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
    return [t.id for s in splits for t in backend.model.tokenize(s)]


class ContinuationEncoder:
    """Turns text that should follow the written tokens into the token ids the target would likely use."""

    def __init__(self, tokenizer, token_bytes: TokenBytes | None = None, tail: int = 3):
        self.tokenizer = tokenizer
        self.token_bytes = token_bytes or TokenBytes(tokenizer)
        self.tail = tail
        self._memo: dict[tuple, np.ndarray] = {}
        # Added tokens with a text of their own (`<tool_call>`): a target may write one as that token or as the
        # plain characters (Qwen2.5 writes `<tool_call>` as characters inside a ``` fence). Those seen written as
        # characters (`plain`) are drafted as characters, the others as their token.
        added = getattr(tokenizer, "get_added_vocab", dict)()
        self.added: dict[str, int] = {text: int(i) for text, i in added.items() if len(text) > 1}
        self.plain: frozenset[str] = frozenset()
        self._split: re.Pattern | None = None

    def learn_spelling(self, ids) -> None:
        """From a finished reply's ids: which added tokens' texts the target wrote as characters, which as the
        token (a text written both ways counts as the token)."""
        if not self.added:
            return
        written = {int(i) for i in ids}
        text = self.token_bytes.join(ids).decode("utf-8", errors="ignore")
        plain = set(self.plain)
        for piece, token_id in self.added.items():
            if piece in text:
                (plain.discard if token_id in written else plain.add)(piece)
        for piece in self.added:  # a closing tag not written yet is spelled as its opening tag was
            if piece.startswith("</") and piece not in text and "<" + piece[2:] in plain:
                plain.add(piece)
        if plain != self.plain:
            self.plain = frozenset(plain)
            atomic = sorted((t for t in self.added if t not in self.plain), key=len, reverse=True)
            self._split = re.compile("(" + "|".join(map(re.escape, atomic)) + ")") if atomic else None
            self._memo.clear()

    def encode(self, text: str) -> list[int]:
        if not any(piece in text for piece in self.plain):
            return self.tokenizer.encode(text, add_special_tokens=False)
        out: list[int] = []
        for part in (self._split.split(text) if self._split is not None else [text]):
            token_id = self.added.get(part)
            if token_id is not None and part not in self.plain:
                out.append(token_id)
            elif part:
                out.extend(encode_plain(self.tokenizer, part))
        return out

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
