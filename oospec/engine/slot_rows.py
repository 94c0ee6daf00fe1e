"""Slot rows: rows appended to the target's verification forwards that read the prompt through the target's own
KV cache and grow token chains of their own, optionally through a LoRA applied to those rows alone.

What a slot row sees. A slot row is a node of the request's *slot forest*: its parent is another node or the
prompt itself. It attends to the prompt (the first `anchor` slots of the cache: what prefill wrote), to its
ancestors and to itself, never to the reply committed since nor to the tree; its position is anchor + depth (a
child of the prompt sits at position `anchor`). That is what a LoRA trained on "prompt KV with the adapter off,
then the rows with it on" saw (oospec.training), so a slot's chain reads as that training's rows whatever the
reply has reached. Chains that share a start (a primer that every argument slot repeats) share its nodes.

Where their keys and values live (oospec.engine.target explains the cache): past the committed slots, in the
*store*, so a chain grows one token per forward without feeding its earlier tokens again:

    [ committed: length | store: m nodes | this forward: pending, tree nodes, slot rows, (padding) ]

Nobody but a slot row sees the store. When a step commits, the accepted tree rows move down to the committed
end, and the store, with this forward's slot rows appended, moves past them (a copy of m + s slots per layer).
Nodes are named by ids given in the order they join the forest (never reused within a request); dropping a
node drops its descendants and closes the gap.

Why the output cannot change: every row of a forward gets the bits a 1-row forward gives it (the invariant
kernels, oospec.engine.invariant), committed and tree rows never see a slot row's keys, and the slot LoRA
(`add_slot_lora`) adds its delta to the slot rows' outputs after the base product over all rows, which is the
very call a forward without slot rows makes. So a tree row's logits are bitwise those of the same forward
without slot rows, and greedy output stays plain greedy's (tests/test_slot_rows.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from oospec.engine.quantized import LinearGroup, LoRALinear, wrap_lora

PROMPT = -1  # the parent of a chain's first node: the prompt itself


@dataclass(frozen=True)
class SlotFeed:
    """The slot rows of one verification forward. Row j becomes node `first_id + j` of the forest when the step
    commits; a parent is a node already in the forest, an earlier row of this feed (by that id), or PROMPT. Node
    ids count from 0 per request, in the order rows join (first_id: the sizes of the earlier feeds added up,
    SlotForest.next_id, which the target checks)."""

    tokens: np.ndarray  # (s,) int64
    parents: np.ndarray  # (s,) int64 node ids (see above)
    first_id: int
    drop: Sequence[int] = ()  # nodes to forget before this forward, with their descendants

    def __len__(self) -> int:
        return int(self.tokens.size)


@dataclass
class SlotPlan:
    """Where a feed's rows sit: positions and what each row sees among the store and the feed."""

    positions: np.ndarray  # (s,) int64: anchor + depth
    depths: np.ndarray  # (s,) int64
    visible: np.ndarray  # (s, m + s) bool: row j sees store node i (column i < m) or feed row k (column m + k)


@dataclass
class SlotForest:
    """The slot nodes the target holds, in store order (parents before children): bookkeeping only, the keys and
    values are the target's (TargetBackend)."""

    anchor: int = 0  # the prompt's length: slot rows see cache slots [0, anchor)
    next_id: int = 0  # the id the next node gets
    ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # (m,) node ids, store order
    depths: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # (m,)
    ancestors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))  # (m, m) self included

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def index(self, node_ids) -> np.ndarray:
        """Store indices of live nodes; ValueError for an id that is not one."""
        node_ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        at = np.searchsorted(self.ids, node_ids)  # ids grow along the store: given in order, never reused
        ok = at < self.ids.size
        ok[ok] = self.ids[at[ok]] == node_ids[ok]
        if not ok.all():
            raise ValueError(f"slot nodes {node_ids[~ok].tolist()} are not in the forest")
        return at

    def drop(self, node_ids: Sequence[int]) -> np.ndarray | None:
        """Forget these nodes and their descendants; the store indices kept, in order (None: nothing dropped)."""
        if not len(node_ids):
            return None
        gone = self.ancestors[:, self.index(node_ids)].any(1)
        if not gone.any():
            return None
        kept = np.flatnonzero(~gone)
        self.ids, self.depths = self.ids[kept], self.depths[kept]
        self.ancestors = self.ancestors[np.ix_(kept, kept)]
        return kept

    def plan(self, feed: SlotFeed) -> SlotPlan:
        """Positions and visibility of the feed's rows; ValueError for a parent that is not there yet."""
        m, s = self.size, len(feed)
        if feed.parents.shape != (s,):
            raise ValueError(f"{s} slot tokens with parents of shape {feed.parents.shape}")
        if feed.first_id != self.next_id:
            raise ValueError(f"a slot feed from node {feed.first_id}; the forest's next node is {self.next_id}")
        visible = np.zeros((s, m + s), dtype=bool)
        depths = np.zeros(s, dtype=np.int64)
        for j, parent in enumerate(feed.parents.tolist()):
            if parent >= self.next_id:  # an earlier row of this feed
                k = parent - self.next_id
                if k >= j:
                    raise ValueError(f"slot row {j}'s parent {parent} is not an earlier row of its feed")
                visible[j] = visible[k]
                depths[j] = depths[k] + 1
            elif parent != PROMPT:
                i = int(self.index([parent])[0])
                visible[j, :m] = self.ancestors[i]
                depths[j] = self.depths[i] + 1
            visible[j, m + j] = True
        return SlotPlan(self.anchor + depths, depths, visible)

    def append(self, feed: SlotFeed, plan: SlotPlan) -> None:
        """The feed's rows join the store (its step committed)."""
        m, s = self.size, len(feed)
        ancestors = np.zeros((m + s, m + s), dtype=bool)
        ancestors[:m, :m] = self.ancestors
        ancestors[m:] = plan.visible
        self.ancestors = ancestors
        self.ids = np.concatenate([self.ids, self.next_id + np.arange(s)])
        self.depths = np.concatenate([self.depths, plan.depths])
        self.next_id += s


# ---------------------------------------------------------------------------------------------------------
# The slot LoRA: the target's weights for every row, plus a LoRA delta on the slot rows only.

@dataclass
class RowSpan:
    """The rows [start, stop) of the forward under way that take the LoRA (start == stop: none), shared by every
    RowLoRALinear of one model."""

    start: int = 0
    stop: int = 0


class RowLoRALinear(LoRALinear):
    """base(x) for every row, by the very call a model without the LoRA makes; then the LoRA delta added to the
    rows of `span` alone (x is [batch 1, rows, in])."""

    def __init__(self, base: nn.Module, a: torch.Tensor, b: torch.Tensor, scaling: float, dtype: torch.dtype,
                 span: RowSpan):
        super().__init__(base, a, b, scaling, dtype)
        self.span = span
        self._panels: tuple | None = None  # (ops, A's panels, B's panels): packed once for the base's kernels

    def delta(self, x: torch.Tensor) -> torch.Tensor:
        """LoRALinear's delta; through the base's invariant kernels where it has them, so that a slot row's bits
        do not depend on how many slot rows share its forward either."""
        ops = getattr(self.base, "ops", None)  # read here: install() may give the base its kernels after the wrap
        if ops is None:
            return super().delta(x)
        h = x.reshape(-1, x.shape[-1]).to(self.lora_a.dtype).contiguous()
        if not hasattr(ops, "pack_linear"):  # the pure-torch kernels
            d = ops.linear(ops.linear(h, self.lora_a, None), self.lora_b, None)
        else:
            _, a, _ = self.panels(ops)
            d = self.up(ops, ops.linear_packed(h, a, None, self.lora_a.shape[0]))
        return self.finish(d, x)

    def panels(self, ops) -> tuple:
        """(ops, A's panels, B's panels) for the C++ kernels, packed once."""
        if self._panels is None or self._panels[0] is not ops:
            self._panels = (ops, ops.pack_linear(self.lora_a.detach()), ops.pack_linear(self.lora_b.detach()))
        return self._panels

    def up(self, ops, xa: torch.Tensor) -> torch.Tensor:
        """(x A^T) [rows, r] -> (x A^T) B^T [rows, out], on the C++ kernels."""
        return ops.linear_packed(xa, self.panels(ops)[2], None, self.lora_b.shape[0])

    def finish(self, d: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (d * self.scaling).to(x.dtype).view(*x.shape[:-1], d.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        a, b = self.span.start, self.span.stop
        if a < b:
            y[..., a:b, :] += self.delta(x[..., a:b, :])
        return y


class RowLoRAGroup:
    """RowLoRALinear layers that read one x (q, k and v; gate and up), as the lean decoder layer calls them: their
    bases as one LinearGroup call (each output the bits of its own layer's call), then the slot rows' deltas with
    every layer's A in one product (each output column is a dot product of its own: the bits of each layer's own
    x A^T) and each layer's B on its columns. Without it, each wrapped layer was its own base call plus two more for
    its delta: a forward of 16 tree rows and 6 slot rows took 157 ms against 121 ms for the same rows without the
    LoRA (the AMX Xeon, 1.5B GGUF); with it, ~133 ms."""

    def __init__(self, layers: list[RowLoRALinear], bases: LinearGroup, ops):
        self.layers, self.bases, self.ops, self.span = layers, bases, ops, layers[0].span
        self.ranks = [layer.lora_a.shape[0] for layer in layers]
        self.a = ops.pack_linear(torch.cat([layer.lora_a.detach() for layer in layers]))

    @classmethod
    def of(cls, layers: list[nn.Module]) -> RowLoRAGroup | None:
        """None where the layers are not RowLoRALinear of one span and dtype over bases that make a LinearGroup,
        on the C++ kernels."""
        if not all(type(layer) is RowLoRALinear for layer in layers):
            return None
        if len({(id(layer.span), layer.lora_a.dtype, layer.lora_a.shape[1]) for layer in layers}) != 1:
            return None
        bases = LinearGroup.of([layer.base for layer in layers])
        ops = getattr(layers[0].base, "ops", None)
        return cls(layers, bases, ops) if bases is not None and hasattr(ops, "pack_linear") else None

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        ys = self.bases(x)
        start, stop = self.span.start, self.span.stop
        if start < stop:
            rows = x[..., start:stop, :]
            h = rows.reshape(-1, x.shape[-1]).to(self.layers[0].lora_a.dtype).contiguous()
            xa = self.ops.linear_packed(h, self.a, None, sum(self.ranks))
            first = 0
            for layer, rank, y in zip(self.layers, self.ranks, ys):
                d = layer.up(self.ops, xa[:, first:first + rank].contiguous())
                y[..., start:stop, :] += layer.finish(d, rows)
                first += rank
        return ys


def add_slot_lora(model: nn.Module, adapter: str | Path) -> int:
    """Give the slot rows of `model`'s verification forwards a peft LoRA adapter folder: every linear layer it
    names becomes a RowLoRALinear (any linear: nn.Linear, InvariantLinear, QuantizedLinear; before or after
    oospec.engine.invariant.install). Returns how many layers took one."""
    if getattr(model, "oospec_slot_lora", None) is not None:
        raise ValueError("this model has a slot LoRA already")
    span = RowSpan()
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype

    def wrap(module: nn.Module, a: torch.Tensor, b: torch.Tensor, scaling: float) -> nn.Module | None:
        if not hasattr(module, "in_features") or isinstance(module, LoRALinear):
            return None
        return RowLoRALinear(module, a, b, scaling, dtype, span)

    done = wrap_lora(model, adapter, wrap)
    model.oospec_slot_lora = span
    return done


@contextmanager
def lora_rows(model: nn.Module, start: int, stop: int) -> Iterator[None]:
    """Within the block, rows [start, stop) of `model`'s forwards take its slot LoRA (none: nothing to do)."""
    span: RowSpan | None = getattr(model, "oospec_slot_lora", None)
    if span is None or start >= stop:
        yield
        return
    span.start, span.stop = start, stop
    try:
        yield
    finally:
        span.start = span.stop = 0
