"""A dialect's profile: the habits its target shows on prompts of that dialect, and how often it shows them.

Some prompts describe the tools in their own turns, and a target may copy that description instead of writing
the call it means (oospec.tools.pasted). Whether to draft such a copy, and with what confidence, is not the
drafters' to know: it is measured on the sidecar's training traces (`python -m oospec.training.profiles`
writes one `profiles/<dialect>.json` per dialect) and read here by the dialect's name. A dialect without a
profile drafts no habit branch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

PROFILES = Path(__file__).with_name("profiles")
# A habit seen every time in a few dozen calls is still not certain: no branch it sets is drafted above this.
HABIT_CAP = 0.9


@dataclass(frozen=True)
class Rate:
    """How often a habit was seen: `hits` of `of` chances."""

    hits: int
    of: int

    @property
    def share(self) -> float:
        """The measured share to the digits its count can tell (tenths below 100 chances, hundredths from 100:
        one chance more or less moves it by about that much), capped at HABIT_CAP; 0 where never seen."""
        return min(HABIT_CAP, round(self.hits / self.of, 1 if self.of < 100 else 2)) if self.of else 0.0


@dataclass(frozen=True)
class DialectProfile:
    """What drafting a dialect's calls may expect of its target; the default (no rates) expects no habit."""

    dialect: str
    target: str | None = None  # the model whose traces the rates were measured on
    tools_in_prompt: bool = False  # every prompt describes the tools in its own turns, not through the template
    pasted_schema: Rate | None = None  # the first value written as the prompt's schema entry for it
    paste_continued: Rate | None = None  # once the first value is pasted, every further one pasted too
    listing_label: Rate | None = None  # the listing's label ("Name" in `Name: <tool>`) written as the name
    label_alone: Rate | None = None  # of those, the label without the tool's name
    measured_on: dict = field(default_factory=dict, compare=False)  # which traces, for the record

    @property
    def reads_listing(self) -> bool:
        """Whether the prompt's listing of the tools is worth reading at all (some habit branch may use it)."""
        return any(r is not None and r.share > 0 for r in (self.pasted_schema, self.listing_label))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> DialectProfile:
        rates = {k: Rate(**v) if isinstance(v, dict) else None
                 for k, v in data.items() if k in ("pasted_schema", "paste_continued", "listing_label", "label_alone")}
        return cls(**{**data, **rates})


@lru_cache(maxsize=None)
def profile_for(dialect: str | None) -> DialectProfile:
    """The profile stored for `dialect`, or one with no habits where none is."""
    path = PROFILES / f"{dialect}.json"
    if not dialect or not dialect.isidentifier() or not path.is_file():  # a name, never a path
        return DialectProfile(dialect or "")
    return DialectProfile.from_json(json.loads(path.read_text(encoding="utf-8")))


__all__ = ["HABIT_CAP", "PROFILES", "DialectProfile", "Rate", "profile_for"]
