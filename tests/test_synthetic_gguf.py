"""The random-weight GGUF of `oospec models synth-gguf`: the tiny shape, written with Qwen2.5's tokenizer, holds
the tensors llama.cpp writes for a qwen2 model in Q4_K_M (names, shapes, types), weights of a trained model's
spread, the shape's hyper-parameters as transformers reads them, and nothing but its tensors and their alignment
after the metadata. The file is read, never loaded as a model: the loader has its own tests."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from oospec.models.gguf_weights import GGUFFile, Q, read_config
from oospec.models.synthetic_gguf import QWEN25_TOKENIZER_MODEL, SyntheticShape, tensor_plan, write_random_gguf

TINY = SyntheticShape.named("tiny")
QWEN25_TOKENS = 151936  # the pulled Qwen2.5 GGUF's token list (padded by llama.cpp's converter)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> GGUFFile:
    from oospec.models.provision import pull_gguf

    try:
        source = pull_gguf(QWEN25_TOKENIZER_MODEL, progress=False)
    except Exception as exc:  # no network, a failed integrity check: say so and stop here
        pytest.fail(f"this test copies the tokenizer of {QWEN25_TOKENIZER_MODEL} and could not pull it: "
                    f"{type(exc).__name__}: {exc}", pytrace=False)
    path = tmp_path_factory.mktemp("synthetic") / "tiny.gguf"
    write_random_gguf(path, TINY, tokenizer_from=source)
    return GGUFFile(path)


def expected_tiny_tensors() -> dict[str, tuple[Q, tuple[int, ...]]]:
    """Written out by hand, not from tensor_plan: with 2 layers llama.cpp's Q4_K_M rule makes layer 1's attn_v and
    ffn_down Q6_K (the last eighth: 7 * 2 // 8 = 1) and layer 0's Q4_K."""
    hidden, kv, ffn = 256, 2 * 64, 512
    tensors = {"token_embd.weight": (Q.Q4_K, (QWEN25_TOKENS, hidden)), "output_norm.weight": (Q.F32, (hidden,)),
               "output.weight": (Q.Q6_K, (QWEN25_TOKENS, hidden))}
    for i, more_bits in ((0, Q.Q4_K), (1, Q.Q6_K)):
        tensors |= {f"blk.{i}.{name}": spec for name, spec in {
            "attn_norm.weight": (Q.F32, (hidden,)), "ffn_norm.weight": (Q.F32, (hidden,)),
            "attn_q.weight": (Q.Q4_K, (hidden, hidden)), "attn_q.bias": (Q.F32, (hidden,)),
            "attn_k.weight": (Q.Q4_K, (kv, hidden)), "attn_k.bias": (Q.F32, (kv,)),
            "attn_v.weight": (more_bits, (kv, hidden)), "attn_v.bias": (Q.F32, (kv,)),
            "attn_output.weight": (Q.Q4_K, (hidden, hidden)),
            "ffn_gate.weight": (Q.Q4_K, (ffn, hidden)), "ffn_up.weight": (Q.Q4_K, (ffn, hidden)),
            "ffn_down.weight": (more_bits, (hidden, ffn)),
        }.items()}
    return tensors


def test_tensors_have_llama_cpp_names_shapes_and_types(tiny_gguf):
    found = {name: (t.qtype, t.shape) for name, t in tiny_gguf.tensors.items()}
    assert found == expected_tiny_tensors()
    assert len(tiny_gguf.field("tokenizer.ggml.tokens")) == QWEN25_TOKENS
    assert tiny_gguf.field("general.file_type") == 15  # MOSTLY_Q4_K_M


def test_weights_are_finite_with_a_trained_models_spread(tiny_gguf):
    for name, tensor in tiny_gguf.tensors.items():
        if name.startswith("blk.") and not name.endswith("norm.weight"):
            w = tensor.dequantize()
            assert np.isfinite(w).all() and 0.01 < w.std() < 0.06, (name, w.std())


def test_transformers_reads_the_shape(tiny_gguf):
    config = read_config(tiny_gguf.path)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.vocab_size, config.max_position_embeddings) == (
        TINY.hidden_size, TINY.intermediate_size, TINY.num_layers, TINY.num_heads, TINY.num_kv_heads,
        QWEN25_TOKENS, TINY.context_length)
    assert config.rope_parameters["rope_theta"] == TINY.rope_theta
    assert config.rms_norm_eps == pytest.approx(TINY.rms_norm_eps)
    assert not config.tie_word_embeddings


def test_the_file_is_its_metadata_then_its_aligned_tensors(tiny_gguf):
    alignment = tiny_gguf.alignment
    tensor_bytes = sum(GGUFWriter.ggml_pad(t.raw.nbytes, alignment) for t in tiny_gguf.tensors.values())
    assert tiny_gguf.path.stat().st_size == tiny_gguf.data_offset + tensor_bytes


def test_the_7b_plan_has_the_type_mix_of_a_real_q4_k_m():
    """The Q6_K layers and the type counts of the pulled Qwen2.5-Coder-1.5B Q4_K_M, also 28 layers: llama.cpp
    counts layers in name order (0, 1, 10, ..., 19, 2, 20, ...), so its rule's layers 0-2, 5, 8, ... are these."""
    plan = tensor_plan(SyntheticShape.named("qwen2.5-7b"))
    for kind in ("attn_v", "ffn_down"):
        q6_k = {int(t.name.split(".")[1]) for t in plan if f".{kind}." in t.name and t.qtype == Q.Q6_K}
        assert q6_k == {0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27}, kind
    counts = {qtype: sum(t.qtype == qtype for t in plan) for qtype in (Q.Q4_K, Q.Q6_K, Q.F32)}
    assert counts == {Q.Q4_K: 169, Q.Q6_K: 29, Q.F32: 141}
