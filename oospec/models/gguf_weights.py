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

import hashlib
import mmap
import os
import shutil
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

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


# GGUF value types (gguf-py's GGUFValueType): struct formats of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32


class GGUFFile:
    """A GGUF file's metadata and tensors, memory-mapped. tensors: GGUF name -> StoredTensor.

    Why not gguf-py's GGUFReader: it turns every metadata value into numpy arrays, 6 s and 0.5 GB for a Qwen
    vocabulary of 151k tokens and merges, held as long as the file is open. This reads the same format (the
    tests compare the two on a real file) and skips the arrays, keeping only where they are."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            # 'c': a private copy-on-write mapping, so torch can wrap the arrays without a read-only warning;
            # no page is ever written, so none is ever copied.
            self.data = np.memmap(self.path, dtype=np.uint8, mode="c")
            self.fields, infos, end = _read_header(self.data)
        except (OSError, ValueError, struct.error, IndexError) as exc:
            raise ModelIntegrityError(f"{self.path} is not a readable GGUF file: {exc}") from exc
        self.alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_offset = start = -(-end // self.alignment) * self.alignment
        self.architecture = self.field("general.architecture")
        self.tensors = {name: _stored(name, dims, qtype, self.data, start + offset)
                        for name, dims, qtype, offset in infos}

    def field(self, key: str, default=None):
        """A metadata value (a number, a string, or a list of them: arrays are read when asked for), or `default`."""
        value = self.fields.get(key, default)
        return _read_array(self.data, value) if isinstance(value, _SkippedArray) else value

    def unsupported(self) -> dict[str, str]:
        """GGUF name -> type name of every tensor whose type the kernels cannot read."""
        return {name: t.qtype.name for name, t in self.tensors.items() if t.qtype not in SUPPORTED}

    def release(self, tensor: StoredTensor) -> None:
        """Let the kernel drop the file pages of `tensor` (a caller that made its own copy of it): they are clean
        pages of a file mapping, read again from the file if anything touches them later. Keeps the process at
        one copy of each weight while a model loads."""
        mapping = getattr(self.data, "_mmap", None)
        if mapping is None or not hasattr(mapping, "madvise"):
            return
        base = self.data.ctypes.data
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



@dataclass(frozen=True)
class _SkippedArray:
    kind: int
    count: int
    at: int  # the first element's offset


def _read_array(data: np.ndarray, array: _SkippedArray) -> list:
    buf = memoryview(data)
    if array.kind in _SCALARS:
        return list(struct.unpack_from(f"<{array.count}{_SCALARS[array.kind]}", buf, array.at))
    if array.kind != _STRING:
        raise ValueError(f"GGUF arrays of type {array.kind} are not read")
    out, at = [], array.at
    for _ in range(array.count):
        (size,) = struct.unpack_from("<Q", buf, at)
        out.append(bytes(buf[at + 8:at + 8 + size]).decode("utf-8", errors="replace"))
        at += 8 + size
    return out


def _read_header(data: np.ndarray):
    """(scalar fields, tensor infos (name, dims, type, offset), end of the header) of a GGUF version 2 or 3."""
    buf = memoryview(data)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("no GGUF magic")
    version, n_tensors, n_fields = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}")
    pos = 24

    def string(at: int) -> tuple[str, int]:
        (size,) = struct.unpack_from("<Q", buf, at)
        return bytes(buf[at + 8:at + 8 + size]).decode("utf-8", errors="replace"), at + 8 + size

    def skip(kind: int, at: int, count: int) -> int:
        if kind in _SCALARS:
            return at + count * struct.calcsize(_SCALARS[kind])
        for _ in range(count):
            if kind == _STRING:
                at += 8 + struct.unpack_from("<Q", buf, at)[0]
            elif kind == _ARRAY:
                inner, n = struct.unpack_from("<IQ", buf, at)
                at = skip(inner, at + 12, n)
            else:
                raise ValueError(f"GGUF value type {kind}")
        return at

    fields: dict = {}
    for _ in range(n_fields):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if kind in _SCALARS:
            (fields[key],) = struct.unpack_from("<" + _SCALARS[kind], buf, pos)
            pos += struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            fields[key], pos = string(pos)
        elif kind == _ARRAY:
            inner, count = struct.unpack_from("<IQ", buf, pos)
            fields[key] = _SkippedArray(inner, count, pos + 12)
            pos = skip(inner, pos + 12, count)
        else:
            raise ValueError(f"GGUF value type {kind} at field {key!r}")
    infos = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        qtype, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, dims, qtype, offset))
    return fields, infos, pos


def _stored(name: str, dims, qtype: int, data: np.ndarray, start: int) -> StoredTensor:
    shape = tuple(int(d) for d in reversed(dims))
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    try:
        qtype = GGMLQuantizationType(qtype)
        block, size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError) as exc:
        raise ModelIntegrityError(f"GGUF tensor {name}: unknown type {qtype}") from exc
    if shape[-1] % block:
        raise ModelIntegrityError(f"GGUF tensor {name}: rows of {shape[-1]} elements are not whole {qtype.name} blocks")
    nbytes = rows * shape[-1] // block * size
    if start + nbytes > data.size:
        raise ModelIntegrityError(f"GGUF tensor {name}: {nbytes} bytes of {qtype.name} run past the end of the file")
    return StoredTensor(name, qtype, shape, data[start:start + nbytes].reshape(rows, -1))


def metadata_folder(path: str | Path) -> Path:
    """A folder holding the transformers config and tokenizer (with its chat template) of a GGUF, made from the
    file's metadata on first use and kept under $OOSPEC_HOME/gguf-metadata, keyed by the file's path, size and
    modification time. Why: transformers reads them by parsing the whole file's metadata with gguf-py, 7 s each
    for a Qwen vocabulary; saved, they load in a fraction of a second."""
    from transformers import AutoConfig, AutoTokenizer

    from oospec.models.registry import oospec_home

    path = Path(path).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = oospec_home() / "gguf-metadata" / f"{path.stem}-{key}"
    if (folder / "config.json").is_file():
        return folder
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if config.model_type not in _ARCHITECTURES:
        raise ModelIntegrityError(f"{path}: architecture {config.model_type!r}; quantized loading reads "
                                  f"{' and '.join(_ARCHITECTURES)}")
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not tokenizer.chat_template:
        raise ModelIntegrityError(f"{path} has no chat template in its metadata; oospec needs one to build prompts")
    partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer.save_pretrained(str(partial))
    config.save_pretrained(str(partial))  # config.json last: its presence marks a whole folder
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
    return folder


def read_config(path: str | Path):
    """The transformers config of a qwen2 or llama GGUF, from its metadata (as `convert.py`'s loader reads it)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(metadata_folder(path)))


def read_tokenizer(path: str | Path):
    """The tokenizer with its chat template, from the GGUF's metadata."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(metadata_folder(path)))


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
