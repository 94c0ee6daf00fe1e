"""The target backend: a Hugging Face causal LM that prefills a prompt and verifies token trees.

State is explicit and small: one preallocated KV buffer per layer and the committed length. A
verification forward writes the pending token and every tree node after the committed length; `commit`
then keeps the pending token and the accepted nodes, moving them to consecutive slots. Rejected nodes
are simply overwritten by the next step, so rejection costs nothing and the cache never grows from them.

Slot rows (oospec.engine.slot_rows) add a store of their own nodes between the committed slots and the forward's
rows, which only they see; `commit` moves it past the newly committed slots.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from oospec.engine.budget import GPU_PADDED_CURVE, CostModel, default_cost_model
from oospec.engine.quantized import QuantizedLinear
from oospec.engine.slot_rows import SlotFeed, SlotForest, SlotPlan, lora_rows
from oospec.engine.tree import TokenTree


def _cache_arg_name() -> str:
    """The decoder forward's name for the KV cache: `cache` since transformers renamed it (5.2x),
    `past_key_values` before (vLLM 0.32 pins transformers < 5.20, and oospec's sidecar runs in vLLM's environment)."""
    from transformers.models.llama.modeling_llama import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


CACHE_ARG = _cache_arg_name()


def cache_arg(cache: Cache) -> dict[str, Cache]:
    """`model(..., **cache_arg(cache))` passes the cache under this transformers' name for it."""
    return {CACHE_ARG: cache}


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values in a buffer allocated once; `length` counts the committed slots, `reserved` the
    slot rows' store after them (a forward writes past both)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.reserved = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor, rows: int | None = None) -> None:
        """Allocate the buffers for `rows` sequences (default: as many as key_states has) shaped like the states."""
        b, h, _, d = key_states.shape
        self.device = key_states.device
        self.keys = key_states.new_empty((rows or b, h, self.capacity, d))
        self.values = value_states.new_empty((rows or b, value_states.shape[1], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def load(self, keys: torch.Tensor, values: torch.Tensor, n: int, rows: int | None = None) -> None:
        """Make the first `n` slots a copy of keys[:, :, :n] and values[:, :, :n] and commit them: a cached
        prefix copied into this layer. rows: sequences in the buffer (a batch-1 prefix is copied into each);
        the buffers are allocated first if they are missing or hold another number of rows."""
        rows = rows or keys.shape[0]
        if not self.is_initialized or self.keys.shape[0] != rows:
            self.lazy_initialization(keys, values, rows)
        self.keys[:, :, :n] = keys[:, :, :n]
        self.values[:, :, :n] = values[:, :, :n]
        self.length = n
        self.reserved = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.length + self.reserved
        end = start + key_states.shape[-2]
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        return self.keys[:, :, :end], self.values[:, :, :end]

    def keep(self, rows: torch.Tensor | None, count: int, reserved: int = 0) -> None:
        """Commit `count` slots and hold `reserved` store slots after them: rows[j] (a slot past `length`: the
        store's, the last forward's) moves to slot length+j (None: the first count+reserved are in place)."""
        if rows is not None:
            start = self.length
            self.keys[:, :, start : start + rows.numel()] = self.keys[:, :, start + rows]
            self.values[:, :, start : start + rows.numel()] = self.values[:, :, start + rows]
        self.length += count
        self.reserved = reserved

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + self.reserved + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity


def greedy_choices(logits: torch.Tensor) -> np.ndarray:
    """(..., vocab) logits -> (...,) int64 argmax: the first largest, a NaN counting as the largest (torch's rule
    and numpy's). On a CPU numpy's: torch's CPU argmax took 260 us for one 151,936-word row on two threads,
    numpy's 45 (bfloat16 to float32 is exact, so the same choice)."""
    if logits.device.type != "cpu":
        return logits.argmax(-1).cpu().numpy()
    return logits.detach().float().numpy().argmax(-1).astype(np.int64, copy=False)


# Prompt tokens per prefill forward. Chunks let the engine hand the target more cores between them (once a
# sidecar on the same CPU has answered), and 256 tokens still keep the GEMMs compute-bound: a 650-token
# prefill of Qwen2.5-Coder-1.5B (float32, packed kernels, 1 thread, CPU time of the thread, busy machine)
# took 24.2 s in 256-token chunks, 25.4 s in 512, 26.2 s in 128, 28.7 s in 64, 25.7 s in one forward.
PREFILL_CHUNK = 256


class TargetBackend:
    """Greedy prefill and tree verification over one request at a time (batch 1).

    prefill_chunk: prompt tokens per prefill forward (0: the whole prompt in one forward)."""

    def __init__(self, model: torch.nn.Module, prefill_chunk: int = PREFILL_CHUNK):
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {prefill_chunk}")
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # weights read from GGUF blocks (oospec.engine.quantized): their cost curve is their own
        self.quantized = any(isinstance(m, QuantizedLinear) for m in model.modules())
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self._layers: list[SlotLayer] = []
        self._cache: Cache | None = None
        self.slots = SlotForest()  # the slot rows' nodes held past the committed slots (oospec.engine.slot_rows)
        self._fed: tuple[int, SlotFeed, SlotPlan] | None = None  # the last forward's tree rows and slot rows
        self._neg = torch.finfo(self.dtype).min
        # The invariant forward (oospec.engine.invariant) covers forwards of at most STEP_ROWS rows: trees
        # stay within it, so every verification row is computed as a 1-row decode would compute it.
        invariant = getattr(model, "oospec_invariant", None)
        self.max_tree_nodes = invariant["step_rows"] - 1 if invariant else None
        # On accelerators (oospec.engine.padded) every decode and verification forward holds step_rows rows.
        self.step_rows = invariant["step_rows"] if invariant and invariant.get("padded") else None

    def cost_model(self, threads: int | None = None) -> CostModel:
        """c(k)/c(1) of this target's verification forwards: the measured curve of its device, dtype and
        `threads` (None: the thread count in use now); for padded forwards, whose shape never changes, the
        GPU's measured curve (nearly flat)."""
        if self.step_rows:
            return CostModel.from_curve(GPU_PADDED_CURVE)
        return default_cost_model(self.dtype, self.device.type, threads, self.quantized)

    @property
    def length(self) -> int:
        """Committed tokens in the KV cache."""
        return self._layers[0].length if self._layers else 0

    def reset(self, capacity: int) -> None:
        """Start a new request whose prompt, output and largest tree fit in `capacity` slots."""
        self.slots, self._fed = SlotForest(), None
        if self.step_rows:
            capacity += self.step_rows  # a padded forward writes step_rows slots, whatever the tree
        if self._layers and self._layers[0].capacity >= capacity:
            for layer in self._layers:
                # buffers stay: everything past `length` is overwritten before it is read
                layer.length = layer.reserved = 0
            return
        n_layers = self.model.config.num_hidden_layers
        self._layers = [SlotLayer(capacity) for _ in range(n_layers)]
        self._cache = Cache(layers=self._layers)

    @torch.inference_mode()
    def prefill(self, prompt_ids: np.ndarray, start: int = 0, between_chunks: Callable[[], None] | None = None) -> int:
        """Encode the prompt into the cache and return the target's first greedy token.

        start: prompt tokens already in the cache (restored by `load_prefix`); only the rest is encoded.
        between_chunks: called before every prefill chunk but the first (the engine changes threads there)."""
        return int(greedy_choices(self.prefill_logits(prompt_ids, start, between_chunks).reshape(-1)))

    @torch.inference_mode()
    def prefill_logits(self, prompt_ids: np.ndarray, start: int = 0,
                       between_chunks: Callable[[], None] | None = None) -> torch.Tensor:
        """Like `prefill`, but return the (vocab,) logits after the last prompt token.

        The prompt goes in `prefill_chunk` tokens per forward, each attending to the slots the chunks before it
        wrote: the same keys, values and logits as one forward, up to float rounding (other GEMM shapes)."""
        end = int(prompt_ids.size)
        if start != self.length or not 0 <= start < end or self.slots.size:
            raise ValueError(f"prefill from {start} with {self.length} cached tokens and a {end}-token prompt")
        ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=self.device).view(1, end)
        positions = torch.arange(end, device=self.device).view(1, end)
        step = self.prefill_chunk or end
        for a in range(start, end, step):
            b = min(a + step, end)
            if a > start and between_chunks is not None:
                between_chunks()
            out = self.model(input_ids=ids[:, a:b], position_ids=positions[:, a:b], use_cache=True, logits_to_keep=1,
                             **cache_arg(self._cache))
            self._keep(None, b - a)
        self.slots.anchor = end  # slot rows read the prompt
        return out.logits[0, -1]

    @torch.inference_mode()
    def verify(self, pending: int, tree: TokenTree) -> np.ndarray:
        """One forward over the pending token and every tree node; returns the target's greedy choice after
        each of them, (len(tree)+1,) int64 (entry 0: after the pending token)."""
        return greedy_choices(self.verify_logits(pending, tree))

    @torch.inference_mode()
    def verify_logits(self, pending: int, tree: TokenTree) -> torch.Tensor:
        """Like `verify`, but return the (len(tree)+1, vocab) logits."""
        return self.verify_outputs(pending, tree).logits[0]

    @torch.inference_mode()
    def verify_rows(self, pending: int, tree: TokenTree,
                    slots: SlotFeed | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Like `verify_logits`, with slot rows after the tree's (oospec.engine.slot_rows): (the tree's
        (len(tree)+1, vocab) logits, the slot rows' (len(slots), vocab) logits; None without slot rows). The feed's
        rows join the forest when the step commits."""
        if slots is None:
            return self.verify_logits(pending, tree), None
        if self.step_rows:
            raise ValueError("slot rows run on the row-invariant CPU forward, not the padded one")
        logits = self.verify_outputs(pending, tree, slots=slots).logits[0]
        q = len(tree) + 1
        return logits[:q], logits[q:]

    @torch.inference_mode()
    def verify_outputs(self, pending: int, tree: TokenTree, hidden_states: bool = False,
                       slots: SlotFeed | None = None):
        """The model's output of one verification forward (hidden_states: after every layer as well): rows of the
        pending token and the tree, then the slot rows of `slots`."""
        plan = None
        if slots is not None:
            self._drop_slots(slots.drop)
            plan = self.slots.plan(slots)
        q = len(tree) + 1
        real = q + (len(slots) if slots is not None else 0)
        rows = max(real, self.step_rows or 0)  # padding rows repeat the pending token and see only the prefix
        start = self.length
        if self._layers and start + self.slots.size + rows > self._layers[0].capacity:
            raise ValueError(f"{rows} rows after {start} committed slots and {self.slots.size} slot nodes "
                             f"overflow the {self._layers[0].capacity}-slot cache")
        tokens = np.full(rows, pending, dtype=np.int64)
        tokens[1:q] = tree.tokens
        positions = np.full(rows, start, dtype=np.int64)
        positions[1:q] = start + tree.depths
        if plan is not None:
            tokens[q:real] = slots.tokens
            positions[q:real] = plan.positions
        ids = torch.from_numpy(tokens).to(self.device).view(1, rows)
        pos = torch.from_numpy(positions).to(self.device).view(1, rows)
        mask = self._verify_mask(tree, start, rows, plan)
        mask.oospec_real_rows = q  # padded attention computes only these (oospec.engine.padded)
        with lora_rows(self.model, q, real):
            out = self.model(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=hidden_states,
                **cache_arg(self._cache),
            )
        self._fed = (q, slots, plan) if plan is not None else None
        if rows > real:
            out.logits = out.logits[:, :real]
            if hidden_states:
                out.hidden_states = tuple(h[:, :real] for h in out.hidden_states)
        return out

    @torch.inference_mode()
    def commit(self, accepted: np.ndarray) -> None:
        """Keep the pending token and the accepted tree nodes of the last `verify` in the cache, and the slot
        store (the last forward's slot rows joining it) after them."""
        count = accepted.size + 1
        store, fed = self.slots.size, self._fed
        self._fed = None
        if not store and fed is None:
            if np.array_equal(accepted, np.arange(accepted.size)):
                self._keep(None, count)  # a prefix of the step's input: already in place
                return
            rows = np.empty(count, dtype=np.int64)
            rows[0] = 0
            rows[1:] = accepted + 1
            self._keep(torch.from_numpy(rows).to(self.device), count)
            return
        # After the committed slots: the store, then the forward's rows (tree rows first, then slot rows).
        q, feed, plan = fed if fed is not None else (0, None, None)
        fresh = np.arange(len(feed)) + store + q if feed is not None else np.empty(0, dtype=np.int64)
        rows = np.concatenate([[store], accepted + 1 + store, np.arange(store), fresh]).astype(np.int64)
        self._keep(torch.from_numpy(rows).to(self.device), count, store + fresh.size)
        if feed is not None:
            self.slots.append(feed, plan)

    @property
    def slot_bytes(self) -> int:
        """Bytes of keys and values one token occupies across all layers (0 before the first forward)."""
        return sum(layer.keys[0, :, 0].nbytes + layer.values[0, :, 0].nbytes for layer in self._layers if layer.is_initialized)

    @torch.inference_mode()
    def save_prefix(self, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the first `n` committed slots of every layer: [(keys, values)], each (1, kv_heads, n, head_dim)."""
        if not 0 < n <= self.length:
            raise ValueError(f"cannot save {n} slots of {self.length} committed")
        return [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in self._layers]

    @torch.inference_mode()
    def load_prefix(self, kv: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> None:
        """Make the first `n` slots of a freshly `reset` cache those saved by `save_prefix` (same model)."""
        if self.length:
            raise ValueError("load_prefix needs a freshly reset cache")
        if len(kv) != len(self._layers) or n > self._layers[0].capacity:
            raise ValueError(f"a {len(kv)}-layer prefix of {n} slots does not fit this cache")
        for layer, (keys, values) in zip(self._layers, kv):
            layer.load(keys, values, n)

    def _keep(self, rows: torch.Tensor | None, count: int, reserved: int = 0) -> None:
        for layer in self._layers:
            layer.keep(rows, count, reserved)

    def _drop_slots(self, node_ids) -> None:
        """Forget slot nodes (and their descendants), closing the gaps they leave in the store."""
        kept = self.slots.drop(node_ids)
        if kept is not None:
            self._keep(torch.from_numpy(kept).to(self.device), 0, kept.size)

    def _tree_mask(self, tree: TokenTree, start: int, rows: int) -> torch.Tensor:
        """The mask of a forward without slot rows (`_verify_mask`)."""
        return self._verify_mask(tree, start, rows, None)

    def _verify_mask(self, tree: TokenTree, start: int, rows: int, plan: SlotPlan | None) -> torch.Tensor:
        """(1, 1, rows, start+m+rows) additive mask, m the slot store's nodes: the pending token and each node see
        the whole committed prefix, then their ancestors and themselves; slot rows see the prompt, their ancestors
        in the store and the feed, and themselves; rows past those (padding) see the committed prefix only."""
        q = len(tree) + 1
        m = self.slots.size
        here = start + m  # the forward's first row
        mask = torch.zeros((1, 1, rows, here + rows), dtype=self.dtype)
        mask[0, 0, :, start:] = self._neg
        if q > 1:
            mask[0, 0, :q, here : here + q].masked_fill_(torch.from_numpy(tree.ancestor_mask()), 0.0)
        else:
            mask[0, 0, 0, here] = 0.0
        if plan is not None:
            s = plan.visible.shape[0]
            slot = mask[0, 0, q : q + s]
            slot[:, self.slots.anchor : start] = self._neg
            seen = np.zeros((s, m + rows), dtype=bool)
            seen[:, :m] = plan.visible[:, :m]
            seen[:, m + q : m + q + s] = plan.visible[:, m:]
            slot[:, start:].masked_fill_(torch.from_numpy(seen), 0.0)
        return mask.to(self.device)
