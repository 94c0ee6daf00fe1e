"""GGUF files of a real model's shape and quantization mix, with random weights.

Why: measuring how a 7B-class target loads and decodes from a GGUF (memory-mapped blocks, the Q4_K and Q6_K
kernels, the memory a load takes) needs a 7B GGUF, and none can be downloaded here. Timing does not depend on
weight values (`random_init` says the same of torch models), so a file with the tensor names, shapes and types
llama.cpp writes for Qwen2.5-7B-Instruct in Q4_K_M, random blocks in them and Qwen2.5's real tokenizer (copied
from a pulled GGUF, so prompts tokenize as they would) stands in for the real one. The blocks are generated and
written a chunk at a time, so the 4.7 GB file takes under 1 GB of memory (most of it gguf-py reading the
tokenizer's 300,000 strings).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod
from pathlib import Path

import numpy as np
from gguf import (GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter,
                  LlamaFileType, TokenType)

Q = GGMLQuantizationType
# A known model whose GGUF carries Qwen2.5's tokenizer and chat template (the default tokenizer source).
QWEN25_TOKENIZER_MODEL = "qwen2.5-coder-1.5b"
SHAPE_NAMES = ("qwen2.5-7b", "tiny")
# Bytes of random blocks made at once: what bounds the writer's memory, whatever the tensor's size.
CHUNK_BYTES = 32 << 20
# K-quant blocks span 256 elements of a row, so every row length must be a multiple of it.
K_BLOCK = GGML_QUANT_SIZES[Q.Q4_K][0]

# Block scales, drawn uniformly from these ranges, make dequantized weights of standard deviation 0.02-0.04 (a
# trained model's spread; random_init's is 0.02), so activations stay in range at every layer.
# Q4_K: w = d * scale * q - dmin * min, with q in 0..15 and the 6-bit scales and mins in 0..63 (random bytes);
# dmin about 7.5 d centres the blocks near 0 on average (the mean of q is 7.5).
# Q6_K: w = d * scale * (q - 32), q in 0..63; its int8 sub-scales are drawn from Q6_K_SUB_SCALES.
F16_SCALES = {  # type -> (byte offset of a float16 scale in the block, its range)
    Q.Q4_K: ((0, (1e-4, 2e-4)), (2, (7.5e-4, 1.5e-3))),
    Q.Q6_K: ((208, (1.5e-4, 3.5e-4)),),
}
Q6_K_SUB_SCALE_BYTES = slice(192, 208)  # after 128 bytes of low and 64 of high quant bits
Q6_K_SUB_SCALES = (1, 9)  # [low, high) of the int8 sub-scales
BIAS_STD = 0.02


@dataclass(frozen=True)
class SyntheticShape:
    """A qwen2 model's hyper-parameters. vocab_size None: the tokenizer's token count."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int | None
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    context_length: int = 32768

    def __post_init__(self):
        if self.hidden_size % K_BLOCK or self.intermediate_size % K_BLOCK:
            raise ValueError(f"{self.name}: hidden and intermediate sizes must be multiples of {K_BLOCK} "
                             f"(the K-quant block), not {self.hidden_size} and {self.intermediate_size}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: {self.num_heads} heads do not divide {self.hidden_size} or are not a "
                             f"multiple of {self.num_kv_heads} key-value heads")

    @property
    def head_dim(self) -> int:
        # qwen2 GGUFs have no key for it: llama.cpp and transformers both take hidden size / heads.
        return self.hidden_size // self.num_heads

    @classmethod
    def named(cls, name: str) -> SyntheticShape:
        """'qwen2.5-7b' (random_init's preset of that name) or 'tiny' (the smallest rows K-quants allow, for
        tests; its vocabulary is the tokenizer's)."""
        if name == "tiny":
            return cls(name, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                       vocab_size=None)
        if name not in SHAPE_NAMES:
            raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPE_NAMES)}")
        from oospec.models.random_init import ARCH_PRESETS

        p = ARCH_PRESETS[name]
        return cls(name, hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
                   num_layers=p["num_hidden_layers"], num_heads=p["num_attention_heads"],
                   num_kv_heads=p["num_key_value_heads"], vocab_size=p["vocab_size"], rope_theta=p["rope_theta"],
                   rms_norm_eps=p["rms_norm_eps"], context_length=p["max_position_embeddings"])


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of the file. shape: torch order ((out, in) for a matrix), as GGUFFile reports it."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]

    @property
    def byte_shape(self) -> tuple[int, ...]:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return (*self.shape[:-1], self.shape[-1] // block * size)

    @property
    def nbytes(self) -> int:
        return prod(self.byte_shape)


def q6_k_layers(layers: int) -> set[int]:
    """The layers whose attn_v and ffn_down llama.cpp's Q4_K_M makes Q6_K (llama-quant.cpp's use_more_bits): the
    first and last eighth and every third between, counted in the order llama.cpp quantizes tensors, by name
    (blk.10 before blk.2), not by layer number. The pulled Qwen2.5 GGUFs have exactly these layers."""
    by_name = sorted(range(layers), key=str)
    return {layer for rank, layer in enumerate(by_name)
            if rank < layers // 8 or rank >= 7 * layers // 8 or (rank - layers // 8) % 3 == 2}


def tensor_plan(shape: SyntheticShape) -> list[PlannedTensor]:
    """The tensors llama.cpp writes for a qwen2 model in Q4_K_M (untied output head, q/k/v biases)."""
    hidden, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    plan = [PlannedTensor("token_embd.weight", Q.Q4_K, (shape.vocab_size, hidden))]
    more_bits_layers = q6_k_layers(shape.num_layers)
    for i in range(shape.num_layers):
        more_bits = Q.Q6_K if i in more_bits_layers else Q.Q4_K
        plan += [PlannedTensor(f"blk.{i}.{name}", qtype, dims) for name, qtype, dims in (
            ("attn_norm.weight", Q.F32, (hidden,)),
            ("attn_q.weight", Q.Q4_K, (hidden, hidden)),
            ("attn_q.bias", Q.F32, (hidden,)),
            ("attn_k.weight", Q.Q4_K, (kv, hidden)),
            ("attn_k.bias", Q.F32, (kv,)),
            ("attn_v.weight", more_bits, (kv, hidden)),
            ("attn_v.bias", Q.F32, (kv,)),
            ("attn_output.weight", Q.Q4_K, (hidden, hidden)),
            ("ffn_norm.weight", Q.F32, (hidden,)),
            ("ffn_gate.weight", Q.Q4_K, (shape.intermediate_size, hidden)),
            ("ffn_up.weight", Q.Q4_K, (shape.intermediate_size, hidden)),
            ("ffn_down.weight", more_bits, (hidden, shape.intermediate_size)),
        )]
    return plan + [PlannedTensor("output_norm.weight", Q.F32, (hidden,)),
                   PlannedTensor("output.weight", Q.Q6_K, (shape.vocab_size, hidden))]


def write_random_gguf(path: str | Path, shape: SyntheticShape, *, seed: int = 0,
                      tokenizer_from: Path | None = None) -> int:
    """Write a qwen2 GGUF of `shape` in llama.cpp's Q4_K_M type mix with random weights (the same bytes for the
    same seed) and the tokenizer and chat template of the GGUF `tokenizer_from` (default: the pulled
    QWEN25_TOKENIZER_MODEL's). A vocabulary larger than the tokenizer's is padded as llama.cpp's converter pads
    it ([PADn] tokens of type UNUSED). Returns the file's size in bytes."""
    if tokenizer_from is None:
        from oospec.models.provision import pull_gguf

        tokenizer_from = pull_gguf(QWEN25_TOKENIZER_MODEL, progress=False)
    tokenizer = _tokenizer_fields(tokenizer_from)
    tokens = tokenizer["tokenizer.ggml.tokens"][0]
    shape = replace(shape, vocab_size=shape.vocab_size or len(tokens))
    if shape.vocab_size < len(tokens):
        raise ValueError(f"{shape.name}: vocabulary {shape.vocab_size} is smaller than the {len(tokens)} tokens "
                         f"of {tokenizer_from}")
    padding = range(len(tokens), shape.vocab_size)  # extends the fields' own lists, which the file gets
    tokens.extend(f"[PAD{i}]" for i in padding)
    tokenizer["tokenizer.ggml.token_type"][0].extend(TokenType.UNUSED for _ in padding)

    path = Path(path)
    partial = path.with_name(path.name + ".partial")  # a stopped run leaves no truncated file under `path`
    writer = GGUFWriter(partial, arch="qwen2")
    writer.add_name(f"random {shape.name} shape")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_block_count(shape.num_layers)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_quantization_version(GGML_QUANT_VERSION)
    for key, (value, vtype, sub_type) in tokenizer.items():
        writer.add_key_value(key, value, vtype, sub_type)
    plan = tensor_plan(shape)
    for tensor in plan:
        writer.add_tensor_info(tensor.name, tensor.byte_shape, np.dtype(np.uint8), tensor.nbytes,
                               raw_dtype=tensor.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # The data section, written here rather than by write_tensor_data (which takes a whole tensor at once): each
    # tensor starts aligned, at the offset write_ti_data_to_file recorded for it.
    out = writer.fout[0]
    writer.write_padding(out, out.tell())
    rng = np.random.default_rng(seed)
    for tensor in plan:
        rows, row_bytes = prod(tensor.shape[:-1]), tensor.byte_shape[-1]
        step = max(1, CHUNK_BYTES // row_bytes)
        for start in range(0, rows, step):
            _random_rows(tensor, min(step, rows - start), rng).tofile(out)
        writer.write_padding(out, tensor.nbytes)
    writer.close()
    partial.replace(path)
    return path.stat().st_size


def _tokenizer_fields(path: Path) -> dict[str, tuple[object, GGUFValueType, GGUFValueType | None]]:
    """Every tokenizer.* field of the GGUF at `path`: key -> (value, type, element type of an array)."""
    reader = GGUFReader(path)
    return {key: (field.contents(), field.types[0],
                  field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None)
            for key, field in reader.fields.items() if key.startswith("tokenizer.")}


def _random_rows(tensor: PlannedTensor, rows: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row bytes] of `tensor`: F32 norms of one, small random F32 biases, quantized blocks of random
    quants with their scales in the ranges above."""
    if tensor.qtype == Q.F32:  # a norm or a bias: one row
        is_bias = tensor.name.endswith(".bias")
        values = rng.normal(0.0, BIAS_STD, tensor.shape) if is_bias else np.ones(tensor.shape)
        return values.astype(np.float32).view(np.uint8).reshape(rows, -1)
    block, size = GGML_QUANT_SIZES[tensor.qtype]
    raw = rng.integers(0, 256, (rows, tensor.shape[-1] // block, size), dtype=np.uint8)
    for offset, (low, high) in F16_SCALES[tensor.qtype]:
        scales = rng.uniform(low, high, raw.shape[:2]).astype(np.float16)
        raw[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(*raw.shape[:2], 2)
    if tensor.qtype == Q.Q6_K:
        count = Q6_K_SUB_SCALE_BYTES.stop - Q6_K_SUB_SCALE_BYTES.start
        sub_scales = rng.integers(*Q6_K_SUB_SCALES, (*raw.shape[:2], count), dtype=np.int8)
        raw[:, :, Q6_K_SUB_SCALE_BYTES] = sub_scales.view(np.uint8)
    return raw.reshape(rows, -1)
