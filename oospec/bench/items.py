"""Which items a benchmark runs, chosen the same way by `bench run`, `bench serve` and `bench vllm`.

The options (--dataset, --split, --data, --items, --offset, --limit, --held-out-only, --allow-trained-items)
are defined once, in oospec.cli.options.add_item_options; `Selection` holds what they ask for. `select` loads
the items, and, when the sidecar runs, checks them against its adapter's training data by content
(oospec.sidecar.provenance): trained items are refused unless allowed, or dropped with --held-out-only, so
that no command reports recall as prediction.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from oospec.datasets.sample import Samples
from oospec.errors import OospecError

log = logging.getLogger("oospec.bench")


class BenchError(OospecError):
    """A benchmark run that cannot start as asked (unknown method or dataset, bad options)."""


@dataclass
class Selection:
    """The item options of every benchmark command (BenchConfig has the same fields, for `bench run`)."""

    datasets: list[str] = field(default_factory=list)  # names, "name:split" or file paths
    split: str | None = None  # applies to every dataset given without ":split"
    data: list[str] = field(default_factory=list)  # extra dataset files (load_path)
    items: list[str] = field(default_factory=list)  # only these item ids (e.g. another run's), before offset
    offset: int = 0  # skip the first N items (sessions) of each dataset, before held_out_only and limit
    limit: int | None = None
    held_out_only: bool = False  # drop the items the sidecar adapter was trained on (else they are refused)
    allow_trained_items: bool = False  # run them, warned about and listed
    sessions: bool = False  # offset and limit count sessions (multi-turn dialogues), each kept whole


def select(selection, adapter: str | None) -> tuple[list[tuple[str, list]], list[dict]]:
    """([(label, samples)], the trained items run anyway): `selection`'s items, checked against `adapter` (the
    sidecar's, None when no sidecar runs: nothing to check)."""
    exclude = trained_item_filter(adapter) if selection.held_out_only else None
    datasets = load_datasets(selection, exclude=exclude)
    return datasets, check_trained_items(datasets, adapter, selection.allow_trained_items)


def _dataset_label(spec: str, split: str | None) -> str:
    if Path(spec).exists():
        return Path(spec).stem
    if split is not None and ":" not in spec:
        return f"{spec}:{split}"
    return spec


def _select_sessions(samples: list, selection, exclude) -> list:
    """The turns of the sessions after `offset` sessions, at most `limit` sessions, each session's turns in order
    and contiguous; excluded turns leave their session (the later turns still hold their text)."""
    from oospec.datasets import group_sessions

    groups = group_sessions(samples)
    if not groups and samples:
        raise BenchError(f"--sessions: the items of {samples[0].dataset} are not turns of multi-turn sessions "
                         f"(API-Bank level 1 is)")
    kept = [[s for s in turns if exclude is None or not exclude(s)] for _, turns in groups[selection.offset:]]
    kept = [turns for turns in kept if turns]
    return [s for turns in (kept if selection.limit is None else kept[: selection.limit]) for s in turns]


def load_datasets(selection, exclude: Callable[[object], bool] | None = None) -> list[tuple[str, list]]:
    """[(label, samples)] for every dataset asked for (a Selection or a BenchConfig), validated before any model
    is loaded: each dataset's items after `offset`, less those `exclude` names, at most `limit` of them."""
    from oospec.datasets import load_dataset, load_path

    specs = [s.strip() for s in selection.datasets if s and s.strip()]
    if not specs and not selection.data:
        raise BenchError("no dataset given: use --dataset apibank|bfcl|toolalpaca (comma list) or --data PATH")
    if selection.limit is not None and selection.limit < 1:
        raise BenchError(f"--limit must be at least 1, got {selection.limit}")
    if selection.offset < 0:
        raise BenchError(f"--offset must be >= 0, got {selection.offset}")

    wanted = set(selection.items)

    def chosen(samples):
        picked = [s for s in samples if s.id in wanted] if wanted else list(samples)
        if selection.sessions:
            return Samples(_select_sessions(picked, selection, exclude), getattr(samples, "skipped", ()))
        kept = [s for s in picked[selection.offset:] if exclude is None or not exclude(s)]
        return Samples(kept if selection.limit is None else kept[: selection.limit], getattr(samples, "skipped", ()))

    out: list[tuple[str, list]] = []
    for spec in specs:
        split = None if ":" in spec or Path(spec).exists() else selection.split
        samples = load_dataset(spec, split=split)  # DatasetError (an OospecError) if unknown
        out.append((_dataset_label(spec, split), chosen(samples)))
    for path in selection.data:
        if not Path(path).exists():
            raise BenchError(f"--data file not found: {path}")
        out.append((Path(path).stem, chosen(load_path(path))))
    if wanted:
        missing = wanted - {s.id for _, samples in out for s in samples}
        if missing:
            raise BenchError(f"--items not in these datasets: {', '.join(sorted(missing)[:5])}")
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise BenchError(f"the same dataset is listed twice: {', '.join(labels)}")
    empty = [label for label, samples in out if not samples]
    if empty:
        raise BenchError(f"no samples in: {', '.join(empty)}")
    return out


def trained_item_filter(adapter: str | None):
    """For --held-out-only: a predicate true of the items whose request the adapter's training manifest says was
    used (trained on or used to choose its settings; matched by content, whatever the item's id or file), or sits
    inside a used request's dialogue, or whose gold call uses a tool they call, unless its split held the request
    out (`TrainingManifest.overlap`); None when there is no manifest (nothing to drop)."""
    from oospec.sidecar.provenance import training_manifest

    manifest = training_manifest(adapter)
    if manifest is None:
        return None
    return lambda s: bool(manifest.overlap(s.provenance_request()))


def check_trained_items(datasets, adapter: str | None, allow: bool) -> list[dict]:
    """The items whose request the adapter's training manifest holds (by content: also an earlier part of a used
    dialogue), or that call a tool it was trained on: refused unless `allow`, then warned about loudly and
    returned (for the run's records), each with the training item it matched. Empty when the adapter has no
    manifest."""
    from oospec.sidecar.provenance import describe, not_held_out, training_manifest

    trained = [{"dataset": label, **found} for label, samples in datasets
               for found in not_held_out(adapter, [s.provenance_request() for s in samples])]
    if not trained:
        return []
    message = (f"{len(trained)} benchmark item(s) are not held out from the sidecar adapter's training data "
               f"({training_manifest(adapter).path}): {describe(trained)}")
    if not allow:
        raise BenchError(message + ". Its agreement and speed on them measure recall, not prediction: choose "
                         "held-out items (e.g. --dataset apibank --split 1 --limit 8), pass --held-out-only or "
                         "--allow-trained-items")
    log.warning("WARNING: %s (allowed by --allow-trained-items)", message)
    print(f"WARNING: {message}", file=sys.stderr)
    return trained
