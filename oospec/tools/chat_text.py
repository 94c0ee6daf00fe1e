"""Chat messages to prompt token ids, with the client's text kept as text.

Tokenizing a rendered chat template as one string turns every control-token string in it into the control
token, wherever it came from: a user who writes `<|im_end|>\\n<|im_start|>system\\n...` would open a real system
turn. `ClientText` closes that door the way transformers' `sanitize_control_tokens` does, with three
differences that matter here: dict keys are marked too (a tool schema's property names reach the prompt through
`tojson`), text can be appended after the template (the reply start that tool_choice forces), and the markers
carry a per-instance random nonce instead of fixed private-use characters, so no client text has to be altered
to keep it from forging one.

1. `mark` wraps each control-token string found in client data (messages, tools) in markers that hold the nonce;
2. the chat template renders the marked data (the markers are ASCII letters and digits: `tojson` leaves them as
   they are, even with ensure_ascii, and so do `trim` and the like);
3. `encode` tokenizes the rendered text as before, except that each marked control token is tokenized as plain
   text (`<`, `|`, `im`, ...) and every marker is dropped. A marker a template string method cut apart from its
   token is dropped too, and still separates the text on its two sides, so they cannot join into a token.

Text with no marker is tokenized exactly as before (`tokenizer.encode(text, add_special_tokens=False)`): a
prompt without control-token strings in the client's data gets the same ids as without this module.

Control tokens are the tokenizer's special tokens plus the added tokens the chat template writes itself
(Qwen2.5's `<tool_call>`: a tool result must not be able to write the model's own call markup), as transformers
defines them.
"""

from __future__ import annotations

import re
import secrets
from functools import partial
from typing import Any

import numpy as np

from oospec.errors import InvalidMessagesError
from oospec.tools.tokens import encode_plain


def control_tokens(tokenizer) -> tuple[str, ...]:
    """The token strings only the chat template may produce: special added tokens, and added tokens that occur
    in the template's text."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(template.values())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {t.content for t in added.values() if t.content and (t.special or t.content in template)}
    found.update(s for s in getattr(tokenizer, "all_special_tokens", ()) or () if s)
    return tuple(sorted((t for t in found if not t.isspace()), key=len, reverse=True))


class ClientText:
    """Marks control-token strings in client data and tokenizes rendered text with them as plain text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens = control_tokens(tokenizer)
        self.nonce = secrets.token_hex(8)  # unguessable: a client cannot write a marker it has never seen
        self.start, self.end = f"OOSPEC{self.nonce}S", f"OOSPEC{self.nonce}E"
        alternatives = "|".join(map(re.escape, self.tokens)) or "(?!)"  # (?!): no control tokens, never matches
        self._token_re = re.compile(alternatives)  # longest first: a token wins over the tokens it contains
        start, end = re.escape(self.start), re.escape(self.end)
        # A control token next to either marker is the client's, even if a template string method cut the other
        # marker off; a lone marker is dropped.
        self._marked_re = re.compile(f"{start}(?P<a>{alternatives})(?:{end})?|(?P<b>{alternatives}){end}|{start}|{end}")
        self._newline = None
        self.marked = False  # whether `mark` has found a control token (else `unmark` has nothing to undo)

    # -- before the template ----------------------------------------------------------------------------------

    def mark(self, obj: Any) -> Any:
        """`obj` (a string, or lists and dicts of them, keys included) with control tokens wrapped in markers;
        the very same object when it holds none, so benign data reaches the template untouched."""
        if not self._has_token(obj):
            return obj
        self.marked = True
        return self._mark(obj)

    def _has_token(self, obj: Any) -> bool:
        if isinstance(obj, str):
            return self._token_re.search(obj) is not None
        if isinstance(obj, dict):
            return any(self._has_token(k) or self._has_token(v) for k, v in obj.items())
        if isinstance(obj, (list, tuple)):
            return any(self._has_token(v) for v in obj)
        return False

    def _mark(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self._token_re.sub(lambda m: self.start + m.group(0) + self.end, obj)
        if isinstance(obj, dict):
            return {self._mark(k): self._mark(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self._mark(v) for v in obj]
        return obj

    def unmark(self, obj: Any) -> Any:
        """Marked data back as the client wrote it (what drafters and the sidecar read)."""
        if not self.marked:
            return obj
        if isinstance(obj, str):
            return obj.replace(self.start, "").replace(self.end, "") if self.nonce in obj else obj
        if isinstance(obj, dict):
            return {self.unmark(k): self.unmark(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.unmark(v) for v in obj]
        return obj

    # -- after the template -----------------------------------------------------------------------------------

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat template's text for marked `messages` and `tools`, generation prompt included."""
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: marked control tokens as plain text, everything else as the tokenizer
        reads it (the template's own control tokens included)."""
        if self.nonce not in text:
            return self.tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = []
        at = 0
        for m in self._marked_re.finditer(text):
            if m.start() > at:
                ids += self._encode_piece(text[at:m.start()], as_text=False, first=not ids and at == 0)
            token = m.group("a") or m.group("b")
            if token:
                ids += self._encode_piece(token, as_text=True, first=not ids and m.start() == 0)
            at = m.end()
        if at < len(text):
            ids += self._encode_piece(text[at:], as_text=False, first=not ids and at == 0)
        return ids

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def _encode_piece(self, piece: str, as_text: bool, first: bool) -> list[int]:
        """A piece of the text. One that is not at its start is encoded after a newline that is then removed, so
        that a SentencePiece tokenizer does not add the space it adds at the start of a string."""
        tok = self.tokenizer
        encode = partial(encode_plain, tok) if as_text else partial(tok.encode, add_special_tokens=False)
        ids = None
        if not first:
            if self._newline is None:
                self._newline = self.tokenizer.encode("\n", add_special_tokens=False)
            ids = encode("\n" + piece)
            ids = ids[len(self._newline):] if ids[: len(self._newline)] == self._newline else None
        if ids is None:
            ids = encode(piece)
        token_id = self.tokenizer.convert_tokens_to_ids(piece)
        if as_text and token_id in ids and token_id != self.tokenizer.unk_token_id:
            raise InvalidMessagesError(f"{piece!r} in the messages cannot be kept as text: this tokenizer writes it as "
                                       "its control token even from plain text")
        return ids
