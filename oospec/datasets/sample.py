"""What every dataset format shares: the ``Sample``, reading a data file, and skipping malformed records.

A loader never fails a whole file for one bad record: the record is skipped with a one-line
``logging.warning`` (logger ``oospec.datasets``) and counted in ``Samples.skipped``. Only a file with no
usable record at all raises ``DatasetError``.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from oospec.engine.drafting import Request
from oospec.errors import OospecError
from oospec.sidecar.protocol import Job
from oospec.sidecar.provenance import ProvenanceRequest
from oospec.tools.dialects import ToolCall, get_dialect
from oospec.tools.schema import Tool, to_openai

log = logging.getLogger("oospec.datasets")


class DatasetError(OospecError):
    """A benchmark file or name that cannot be loaded."""


@dataclass
class Sample:
    id: str
    dataset: str
    messages: list[dict[str, Any]]
    tools: list[Tool]
    gold: list[ToolCall] | None
    dialect: str
    meta: dict[str, Any] = field(default_factory=dict)

    def chat_tools(self) -> list[dict] | None:
        """Tools for ``apply_chat_template(tools=...)``; None when the prompt already describes them
        (API-Bank's prose system prompt, BFCL's prompting mode)."""
        if self.meta.get("tools_in_prompt") or not self.tools:
            return None
        return [to_openai(t) for t in self.tools]

    def openai_tools(self) -> list[dict]:
        """The offered tools as OpenAI tool specs (what a request's `tools` holds), whether or not the prompt
        describes them itself."""
        return [to_openai(t) for t in self.tools]

    def sidecar_job(self) -> Job:
        """This sample as the sidecar is asked about it, the call written the way its dialect writes calls (a
        drafter asks in the target's own learned habits instead)."""
        dialect = get_dialect(self.dialect)
        return Job(self.id, self.messages, self.openai_tools(), self.chat_tools(), dialect.opener,
                   dialect.args_key, openers=list(dialect.openers))

    def request(self, **fields) -> Request:
        """This sample as the engine decodes it (`fields`: prompt_ids, sampling, budget...). The only sample
        metadata a drafter sees: gold answers and source files stay out of the request."""
        return Request(messages=self.messages, tools=self.tools, chat_tools=self.chat_tools(), dialect=self.dialect,
                       tools_in_prompt=self.meta.get("tools_in_prompt"), **fields)

    def prompt_text(self, tokenizer, **kwargs) -> str:
        """The prompt string, generation header included."""
        tools = self.chat_tools()
        extra = {"tools": tools} if tools is not None else {}
        return tokenizer.apply_chat_template(self.messages, add_generation_prompt=True, tokenize=False,
                                             **extra, **kwargs)

    def gold_text(self) -> str | None:
        """The gold call(s) written the way the target writes them (a perfect draft)."""
        if not self.gold:
            return None
        return get_dialect(self.dialect).render(self.gold)

    def parse(self, text: str) -> list[ToolCall]:
        return get_dialect(self.dialect).parse(text)

    def provenance_request(self) -> ProvenanceRequest:
        """What a sidecar adapter's training manifest is checked against: this item's request (by content) and
        the tools its gold calls."""
        return ProvenanceRequest(self.id, self.messages, self.tools, frozenset(c.name for c in self.gold or []))


class Samples(list[Sample]):
    """The samples a loader made, plus ``skipped``: one line per malformed record it left out."""

    def __init__(self, samples: Iterable[Sample] = (), skipped: Iterable[str] = ()):
        super().__init__(samples)
        self.skipped: list[str] = list(skipped)

    def skip(self, where: str, reason: Any) -> None:
        """Leave a malformed record out: warn in one line and count it."""
        line = f"{where}: {reason}"
        log.warning("skipped malformed record: %s", line)
        self.skipped.append(line)

    @classmethod
    def concat(cls, parts: Iterable[Samples]) -> Samples:
        out = cls()
        for part in parts:
            out.extend(part)
            out.skipped.extend(getattr(part, "skipped", ()))
        return out

    def head(self, limit: int) -> Samples:
        """The first ``limit`` samples; what was skipped stays counted."""
        return Samples(self[: max(0, int(limit))], self.skipped)


def group_sessions(samples: Iterable[Sample]) -> list[tuple[str, list[Sample]]]:
    """The samples that are turns of one agent session (`meta["session"]`), each session's turns in order
    (`meta["turn"]`); sessions in the order their first turn comes. Samples without a session are left out."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        if s.meta.get("session") is not None:
            groups.setdefault(str(s.meta["session"]), []).append(s)
    return [(name, sorted(turns, key=lambda s: s.meta.get("turn", 0))) for name, turns in groups.items()]


# Why a record could not become a sample. Anything else is a bug in the loader and propagates.
MALFORMED = (OospecError, KeyError, TypeError, ValueError, AttributeError)


@dataclass(frozen=True)
class Unreadable:
    """A JSON Lines line that is not JSON, kept in place so record indices (and sample ids) do not shift."""

    line: int
    error: str


def build_samples(records: Sequence[Any], source: str, make: Callable[[int, Any, Samples], Iterable[Sample]],
                  what: str = "item") -> Samples:
    """``make(index, record, samples)`` for every record; a record it rejects (one of ``MALFORMED``) is skipped.
    ``make`` may also call ``samples.skip`` itself for a part of a record (one ToolAlpaca instruction)."""
    samples = Samples()
    for i, rec in enumerate(records):
        if isinstance(rec, Unreadable):
            samples.skip(f"{source} line {rec.line}", f"not JSON ({rec.error})")
            continue
        try:
            made = list(make(i, rec, samples))
        except MALFORMED as e:
            message = str(e) if isinstance(e, OospecError) else f"{type(e).__name__}: {e}"
            samples.skip(f"{source} {what} {i}", message)
            continue
        samples.extend(made)
    if samples.skipped and not samples:
        raise DatasetError(f"{source}: no usable record; first problem: {samples.skipped[0]}")
    return samples


# --------------------------------------------------------------------------------------------------
# File access
# --------------------------------------------------------------------------------------------------


def data_path(*parts: str):
    """A file under the packaged ``oospec/data`` (its gzipped twin ``name.gz`` when only that exists)."""
    base = resources.files("oospec").joinpath("data")
    for part in parts[:-1]:
        base = base.joinpath(part)
    p = base.joinpath(parts[-1])
    if not p.is_file() and base.joinpath(parts[-1] + ".gz").is_file():
        return base.joinpath(parts[-1] + ".gz")
    return p


def read_text(path) -> str:
    """Text of a file (str, Path or importlib Traversable); ``*.gz`` is decompressed, and ``path.gz`` is read
    when only the gzipped copy of a plain path exists."""
    p = Path(path) if isinstance(path, str) else path
    if isinstance(p, Path) and not p.exists() and Path(str(p) + ".gz").exists():
        p = Path(str(p) + ".gz")
    try:
        raw = p.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise DatasetError(f"data file not found: {path}") from None
    if str(p.name).endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def read_records(path) -> list[Any]:
    """A JSON document (list or object) or JSON Lines. A JSON Lines line that is not JSON becomes an
    ``Unreadable`` (skipped later, by ``build_samples``); a broken JSON list, or a file where no line is a
    JSON object, raises ``DatasetError``."""
    text = read_text(path).lstrip("\ufeff")
    try:
        data = json.loads(text)
    except ValueError as e:
        if text.lstrip().startswith("["):  # one JSON list, not JSON Lines: its lines are not records
            raise DatasetError(f"{path}: not valid JSON ({e})") from None
    else:
        return data if isinstance(data, list) else [data]
    records: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as e:
            records.append(Unreadable(n, str(e)))
    if records and not any(isinstance(r, dict) for r in records):
        first = next((r for r in records if isinstance(r, Unreadable)), None)
        raise DatasetError(f"{path}: neither JSON nor JSON Lines ({first.error if first else 'no JSON object'})")
    return records


__all__ = ["DatasetError", "Sample", "Samples", "Unreadable", "build_samples", "data_path", "read_records",
           "read_text"]
