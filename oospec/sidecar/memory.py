"""How much memory the sidecar's working set may take, and what the row runner's forwards need of it.

The working set is what a job allocates beyond the model's weights: the shared prefix's keys and values,
each batch of rows' own cache, and a forward's transients (the attention mask and weights, activations,
logits). Rows are run in chunks that fit `CHUNK_BYTES`, so the working set grows with the prompt, not with
rows x prompt; a job whose smallest working set (its prefix and one row) exceeds the budget is refused
(`WorkingSetTooLarge`): the target then drafts without hints, as it does whenever the sidecar has no answer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from oospec.errors import OospecError

# The budget, set once for the sidecar process: bytes, or a number with K/M/G/T (powers of 1024), e.g. "6G".
MEMORY_ENV = "OOSPEC_SIDECAR_MEMORY"
# Without the variable: this fraction of the machine's RAM. The sidecar shares the machine with the target
# (and a server may hold more than one engine); a quarter leaves them the rest.
DEFAULT_RAM_FRACTION = 0.25
# The most one batch of rows may take (its caches with their copy of the prefix, and its transients). Large
# enough that the common job (a few tools, an API-Bank-sized prompt of ~1-2k tokens) runs every batch whole,
# as before; many tools over a long prompt run in several batches instead of one copy of the prompt per row.
CHUNK_BYTES = 1 << 30

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class WorkingSetTooLarge(OospecError):
    """A job that would need more memory than the sidecar's budget: refused before anything is allocated."""

    kind = "too-large"  # the fault kind a SidecarClient records for it


def parse_size(text: str) -> int:
    """'6G', '512M', '1.5g', '2000000' -> bytes; a clear error for anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), flags=re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{MEMORY_ENV} must be a positive size such as 6G or 512M, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_memory_budget() -> int:
    """The sidecar's working-set budget in bytes: $OOSPEC_SIDECAR_MEMORY, else a fraction of the machine's RAM."""
    text = os.environ.get(MEMORY_ENV)
    return parse_size(text) if text else int(physical_memory() * DEFAULT_RAM_FRACTION)


def gigabytes(n: int) -> str:
    return f"{n / (1 << 30):.2f} GB"


@dataclass(frozen=True)
class ForwardCost:
    """Bytes a causal LM's forwards take, per unit, from its config (estimates on the safe side)."""

    kv_per_token: int  # one token's keys and values, all layers
    per_score: int  # one (query, key) pair of a row: its mask entry and one layer's attention weights (float32, x2)
    per_query: int  # one fed token's activations in one layer (MLP and attention projections, x2 for temporaries)
    per_logits: int  # one kept position's logits: float32, its float copy and log-softmax

    @classmethod
    def of(cls, config, element_size: int) -> ForwardCost:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        per_query = 2 * (3 * config.intermediate_size + 8 * config.hidden_size) * element_size
        return cls(kv_per_token=config.num_hidden_layers * 2 * kv_heads * head_dim * element_size,
                   per_score=element_size + 2 * 4 * heads, per_query=per_query, per_logits=3 * 4 * config.vocab_size)

    def prefix(self, tokens: int, fed: int) -> int:
        """Encoding a prefix of `tokens`, `fed` of them in the forward (the rest reused): the old and the new
        prefix cache side by side, and the forward's activations (attention without a mask: no score matrix)."""
        return 2 * tokens * self.kv_per_token + fed * self.per_query + self.per_logits

    def row(self, capacity: int, queries: int, keys: int, kept_logits: int) -> int:
        """One row of a batch: its cache of `capacity` slots, a forward of `queries` tokens over `keys` keys, and
        `kept_logits` positions of logits."""
        return (capacity * self.kv_per_token + queries * keys * self.per_score + queries * self.per_query
                + kept_logits * self.per_logits)
