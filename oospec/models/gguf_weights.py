"""A GGUF's tensors as stored: memory-mapped blocks, never expanded, named as transformers names them.

Why: the expanded float32 copy of a quantized GGUF is 4-8x the file (a 1.0 GB Q4_K_M target becomes 6.7 GB on
disk and 10 GB at load). Here a weight stays the GGUF's own bytes (`StoredTensor.raw`, a view of the file mapped
copy-on-write, so nothing is read until a kernel touches it and nothing is ever written back), and the kernels
dequantize it where they use it (`oospec.engine.quantized`). What it must equal is what `convert.py` makes of
the same file: transformers' GGUF loader, which runs gguf-py's numpy dequantization (`StoredTensor.dequantize`,
the reference the kernels are tested against) and reorders the rows of a llama's q and k projections
(`row_order`, derived from transformers' own processor so the two cannot drift apart).

Layering: this module knows files and names, not torch modules; the modules that read `raw` are the engine's.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from oospec.errors import ModelIntegrityError

Q = GGMLQuantizationType
# The types the kernels read (their ids are oospec/engine/kernels/quants.h's): the shipped models use Q4_K, Q6_K
# and Q4_1 (+ Q8_0 embeddings and F32 norms); the rest are the common siblings.
SUPPORTED = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K})
_ARCHITECTURES = ("llama", "qwen2")


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of the file. shape: torch order ((out, in) for a matrix, the GGUF's dims reversed).
    raw: uint8 [rows, row bytes], rows = the product of all dims but the last; each row its own blocks."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    raw: np.ndarray

    @property
    def row_elements(self) -> int:
        return self.shape[-1]

    def dequantize(self) -> np.ndarray:
        """float32 in `shape`: gguf-py's numpy dequantization, the bits transformers' loader produces."""
        from gguf.quants import dequantize

        return dequantize(self.raw, self.qtype).reshape(self.shape)

    def rows(self, order: np.ndarray) -> StoredTensor:
        """The same tensor with its rows taken in `order` (a copy of those rows' bytes)."""
        return StoredTensor(self.name, self.qtype, self.shape, np.ascontiguousarray(self.raw[order]))


class GGUFFile:
    """A GGUF file's metadata and tensors, memory-mapped. tensors: GGUF name -> StoredTensor."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            # 'c': a private copy-on-write mapping, so torch can wrap the arrays without a read-only warning;
            # no page is ever written, so none is ever copied.
            self.reader = GGUFReader(self.path, "c")
        except (OSError, ValueError) as exc:
            raise ModelIntegrityError(f"{self.path} is not a readable GGUF file: {exc}") from exc
        self.architecture = self.field("general.architecture")
        self.tensors = {t.name: _stored(t) for t in self.reader.tensors}

    def field(self, key: str, default=None):
        """A metadata value (a string, a number, or a list of them), or `default`."""
        field = self.reader.get_field(key)
        return default if field is None else field.contents()

    def unsupported(self) -> dict[str, str]:
        """GGUF name -> type name of every tensor whose type the kernels cannot read."""
        return {name: t.qtype.name for name, t in self.tensors.items() if t.qtype not in SUPPORTED}

    def release(self, tensor: StoredTensor) -> None:
        """Let the kernel drop the file pages of `tensor` (a caller that made its own copy of it): they are clean
        pages of a file mapping, read again from the file if anything touches them later. Keeps the process at
        one copy of each weight while a model loads."""
        mapping = getattr(self.reader.data, "_mmap", None)
        if mapping is None or not hasattr(mapping, "madvise"):
            return
        base = self.reader.data.ctypes.data
        start = tensor.raw.ctypes.data - base
        if not 0 <= start < len(mapping):
            return  # a copy (rows taken in another order), not a view of the mapping
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the tensor only
        end = (start + tensor.raw.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > first:
            mapping.madvise(mmap.MADV_DONTNEED, first, end - first)

    @cached_property
    def stored_bytes(self) -> int:
        return sum(t.raw.nbytes for t in self.tensors.values())


def _stored(tensor) -> StoredTensor:
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    raw = np.asarray(tensor.data).view(np.uint8)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    if tensor.tensor_type in GGML_QUANT_SIZES:
        block, size = GGML_QUANT_SIZES[tensor.tensor_type]
        if shape[-1] % block or raw.size != rows * shape[-1] // block * size:
            raise ModelIntegrityError(f"GGUF tensor {tensor.name}: {raw.size} bytes do not hold {shape} elements of "
                                      f"{tensor.tensor_type.name}")
    return StoredTensor(tensor.name, tensor.tensor_type, shape, raw.reshape(rows, -1))


def read_config(path: str | Path):
    """The transformers config of a qwen2 or llama GGUF, from its metadata (as `convert.py`'s loader reads it)."""
    from transformers import AutoConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if config.model_type not in _ARCHITECTURES:
        raise ModelIntegrityError(f"{path}: architecture {config.model_type!r}; quantized loading reads "
                                  f"{' and '.join(_ARCHITECTURES)}")
    return config


def read_tokenizer(path: str | Path):
    """The tokenizer with its chat template, from the GGUF's metadata."""
    from transformers import AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not tokenizer.chat_template:
        raise ModelIntegrityError(f"{path} has no chat template in its metadata; oospec needs one to build prompts")
    return tokenizer


def hf_names(model, gguf: GGUFFile) -> dict[str, str]:
    """GGUF tensor name -> the parameter name transformers gives it in `model` (a skeleton built from the config:
    transformers' own map, so names never disagree with what its loader did for the expanded folder)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(gguf.architecture, TensorProcessor)(config=model.config.to_dict())
    return get_gguf_hf_weights_map(model, processor)


def row_order(model, gguf: GGUFFile, name: str) -> np.ndarray | None:
    """The order in which transformers' loader takes the rows of tensor `name` (llama: q and k are stored with
    their rotary halves interleaved), or None where it keeps the file's order. Derived by running its processor
    on the row indices, so it is the loader's permutation whatever that is."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(gguf.architecture, TensorProcessor)(config=model.config.to_dict())
    rows = gguf.tensors[name].raw.shape[0]
    index = np.arange(rows, dtype=np.int64).reshape(rows, 1)
    order = processor.process(weights=index, name=name).weights.reshape(-1)
    return None if np.array_equal(order, index.reshape(-1)) else order
