"""Decode and verification forwards replayed as CUDA graphs, behind a guard. UNTESTED ON GPU HARDWARE: the CPU
tests check the static-buffer forward bitwise against the padded forward and the capture bookkeeping through
a fake graph API; whether capture succeeds on a GPU, and what it costs there, is tests/gpu_graph_check.py's
to say.

On a GPU the padded forward (oospec.engine.padded) costs 20-36 ms whatever the model: the host launching
kernels layer by layer. Its decode and verification forwards all hold STEP_ROWS rows, so one captured graph
can replay every one of them, given inputs that never move or change shape:

  * `StaticInputs`: the token ids, positions, the slots the rows' keys are written to, and each row's compacted
    visible tree slots and key count (what `padded.compact_rows` derives from the mask), filled on the host
    before each replay; the cache length `start` is a device value too;
  * `StaticSlotLayer`: the KV buffer of a whole capacity, written at the static slots (index_copy_) and read
    whole; the attention reads `start` from memory and visits key blocks up to the capacity, where blocks past
    a row's keys change nothing (see rowwise_triton), so a row reads the same keys in the same blocks as in the
    padded forward: graphs change launches, not arithmetic;
  * one graph per capacity bucket (`CAPACITY_STEP` slots; the padded size is always STEP_ROWS), captured at a
    bucket's first verification and replayed after.

The prefill, forwards of more rows and forwards asked for hidden states run as the padded forward does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from oospec.engine import padded
from oospec.engine.target import PREFILL_CHUNK, SlotLayer, TargetBackend, cache_arg
from oospec.engine.tree import TokenTree
from transformers.cache_utils import Cache

GRAPH_ATTN = "oospec_rowwise_static"
CAPACITY_STEP = 1024  # slots per capacity bucket: a request that outgrows its bucket's graph gets a new one
WARMUP_RUNS = 2  # forwards on a side stream before capture (allocator, Triton's compile and autotune)


def capacity_bucket(slots: int) -> int:
    """The static capacity that holds `slots` (rounded up to CAPACITY_STEP): one graph serves the whole bucket."""
    return -(-max(slots, 1) // CAPACITY_STEP) * CAPACITY_STEP


def graph_unavailable(model: torch.nn.Module) -> str:
    """Why this model's forwards cannot be replayed as CUDA graphs ('' when they can)."""
    report = getattr(model, "oospec_invariant", None)
    if not report or not report.get("padded"):
        return "the padded forward is not installed (oospec.engine.padded.install)"
    device = next(model.parameters()).device
    if device.type != "cuda":
        return f"device is {device.type}: CUDA graphs need cuda"
    if not torch.cuda.is_available():
        return "torch reports no CUDA"
    return ""


@dataclass
class StaticInputs:
    """The device buffers a captured forward reads: filled before every replay, never reallocated."""

    rows: int
    capacity: int
    device: torch.device
    dtype: torch.dtype
    real_rows: int = 0  # rows of the current tree (host; the eager kernel computes only these)
    active: bool = False  # the static forward is running (the cache layers and the attention read this)
    ids: torch.Tensor = field(init=False)
    positions: torch.Tensor = field(init=False)
    start: torch.Tensor = field(init=False)
    write_slots: torch.Tensor = field(init=False)
    tree_slots: torch.Tensor = field(init=False)
    lengths: torch.Tensor = field(init=False)
    mask: torch.Tensor = field(init=False)

    def __post_init__(self):
        d = self.device
        self.ids = torch.zeros((1, self.rows), dtype=torch.long, device=d)
        self.positions = torch.zeros((1, self.rows), dtype=torch.long, device=d)
        self.start = torch.zeros(1, dtype=torch.int32, device=d)
        self.write_slots = torch.zeros(self.rows, dtype=torch.long, device=d)
        self.tree_slots = torch.zeros((self.rows, self.rows), dtype=torch.int32, device=d)
        self.lengths = torch.zeros(self.rows, dtype=torch.int32, device=d)
        # transformers wants a mask; the static attention reads the compacted slots instead.
        self.mask = torch.zeros((1, 1, self.rows, self.capacity), dtype=self.dtype, device=d)

    def fill(self, pending: int, tree: TokenTree, start: int) -> None:
        """The inputs of one verification forward at cache length `start`, laid out as the padded forward lays
        them out (TargetBackend.verify_outputs): row 0 the pending token, then the nodes, then padding rows that
        repeat the pending token and see the prefix only."""
        q = len(tree) + 1
        if q > self.rows or start + self.rows > self.capacity:
            raise ValueError(f"a {q}-row tree at {start} does not fit {self.rows} rows of {self.capacity} slots")
        tokens = np.full(self.rows, pending, dtype=np.int64)
        tokens[1:q] = tree.tokens
        positions = np.full(self.rows, start, dtype=np.int64)
        positions[1:q] = start + tree.depths
        visible = np.zeros((self.rows, self.rows), dtype=bool)
        visible[:q, :q] = tree.ancestor_mask()
        # Visible slots first, each group in slot order: what padded.compact_rows computes from the mask.
        order = np.argsort(~visible, axis=1, kind="stable").astype(np.int32)
        self.ids.copy_(torch.from_numpy(tokens).view(1, -1))
        self.positions.copy_(torch.from_numpy(positions).view(1, -1))
        self.start.fill_(start)
        self.write_slots.copy_(torch.arange(start, start + self.rows))
        self.tree_slots.copy_(torch.from_numpy(order))
        self.lengths.copy_(torch.from_numpy((visible.sum(1) + start).astype(np.int32)))
        self.real_rows = q


class StaticSlotLayer(SlotLayer):
    """A SlotLayer whose static forwards write their rows at `StaticInputs.write_slots` and return the whole
    buffer (shapes that never change); other forwards (the prefill) work as SlotLayer's."""

    def __init__(self, capacity: int, static: StaticInputs):
        super().__init__(capacity)
        self.static = static

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.static.active:
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys.index_copy_(2, self.static.write_slots, key_states)
        self.values.index_copy_(2, self.static.write_slots, value_states)
        return self.keys, self.values


def reference_kernel(q, k, v, static: StaticInputs, scale: float) -> torch.Tensor:
    """The padded forward's torch attention on the static buffers (CPU tests; reads `start` on the host, so it is
    never captured)."""
    keys = int(static.start.item()) + static.rows
    return padded.attention_reference(q, k[:, :keys], v[:, :keys], static.tree_slots, static.lengths, scale,
                                      static.real_rows)


def static_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                     **kwargs):
    """transformers' attention interface: the static forward's rows through `module.oospec_static_kernel`;
    every other forward as the padded forward runs it."""
    static = getattr(module, "oospec_static", None)
    if static is None or not static.active or query.shape[2] != static.rows:
        return padded.rowwise_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = module.oospec_static_kernel(query[0], key[0], value[0], static, scale)
    return out.unsqueeze(0), None


def _register_attention() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS.register(GRAPH_ATTN, static_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GRAPH_ATTN, sdpa_mask)


@dataclass
class Captured:
    """A captured forward: `replay()` recomputes `output` in place from the static inputs."""

    replay: Callable[[], None]
    output: torch.Tensor


class CudaGraphApi:
    """Capture with torch.cuda: warm-up forwards on a side stream, then one CUDAGraph."""

    def capture(self, forward: Callable[[], torch.Tensor]) -> Captured:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP_RUNS):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = forward()
        return Captured(graph.replay, output)


class GraphTargetBackend(TargetBackend):
    """TargetBackend whose decode and verification forwards replay a CUDA graph where `graph_unavailable` allows,
    and otherwise run the same static-buffer forward eagerly (`graph_reason` says why).

    graph_api: what captures (default: CUDA graphs); tests pass a fake to check the bookkeeping on a CPU."""

    def __init__(self, model: torch.nn.Module, prefill_chunk: int = PREFILL_CHUNK, graph_api=None):
        super().__init__(model, prefill_chunk)
        if not self.step_rows:
            raise ValueError("GraphTargetBackend needs the padded forward (oospec.engine.padded.install)")
        self.graph_reason = graph_unavailable(model)
        self.graph_api = graph_api or (None if self.graph_reason else CudaGraphApi())
        kernel = reference_kernel
        if self.device.type == "cuda":
            from oospec.engine.rowwise_triton_static import static_kernel

            kernel = static_kernel
        for layer in model.model.layers:
            layer.self_attn.oospec_static_kernel = kernel
        _register_attention()
        model.config._attn_implementation = GRAPH_ATTN
        self.static: StaticInputs | None = None
        self.captured: Captured | None = None
        self.captures = 0  # graphs captured so far (one per capacity bucket a request needed)

    @property
    def uses_graphs(self) -> bool:
        return self.graph_api is not None

    def reset(self, capacity: int) -> None:
        bucket = capacity_bucket(capacity + self.step_rows)
        if self.static is not None and self.static.capacity >= bucket:
            for layer in self._layers:
                layer.length = 0  # buffers stay: everything past `length` is overwritten before it is read
            return
        self.static = StaticInputs(self.step_rows, bucket, self.device, self.dtype)
        self._layers = [StaticSlotLayer(bucket, self.static) for _ in range(self.model.config.num_hidden_layers)]
        self._cache = Cache(layers=self._layers)
        for layer in self.model.model.layers:
            layer.self_attn.oospec_static = self.static
        self.captured = None  # the old graph reads buffers that are gone

    @torch.inference_mode()
    def verify_outputs(self, pending: int, tree: TokenTree, hidden_states: bool = False):
        q = len(tree) + 1
        if hidden_states or q > self.step_rows:
            return super().verify_outputs(pending, tree, hidden_states)
        self.static.fill(pending, tree, self.length)
        if self.graph_api is None:
            logits = self._forward()
        else:
            if self.captured is None:
                self.captured = self.graph_api.capture(self._forward)
                self.captures += 1
            self.captured.replay()
            logits = self.captured.output
        return SimpleNamespace(logits=logits[:, :q].clone())  # the static output is overwritten by the next replay

    def _forward(self) -> torch.Tensor:
        s = self.static
        s.active = True
        try:
            out = self.model(input_ids=s.ids, position_ids=s.positions, attention_mask=s.mask, use_cache=True,
                             **cache_arg(self._cache))
        finally:
            s.active = False
        return out.logits


def enable_graphs(engine, graph_api=None) -> str:
    """Opt an Engine (oospec.engine.engine) into graph replay: its target becomes a GraphTargetBackend where
    `graph_unavailable` allows (or a `graph_api` is given: tests). Returns '' when enabled, else the reason, the
    engine left as it was."""
    reason = graph_unavailable(engine.model)
    if reason and graph_api is None:
        return reason
    engine.target = GraphTargetBackend(engine.model, engine.target.prefill_chunk, graph_api=graph_api)
    return ""
