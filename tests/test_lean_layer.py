"""The lean decoder layer (oospec.engine.lean_layer) computes the stock layer's bits: every hidden state of a
prefill, and the logits of a verification tree and of slot rows through a huge LoRA, are bitwise those of the
stock forward, for qwen2 and llama, float32 and bfloat16, and for a GGUF target whose q/k/v and gate/up run as
one kernel call each. A deliberate change to the lean forward is caught by the same comparison."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import tiny_model, write_random_lora
from transformers.models.qwen2.modeling_qwen2 import rotate_half

from oospec.engine import lean_layer
from oospec.engine.precision import prepare
from oospec.engine.lean_layer import install_lean, remove_lean
from oospec.engine.quantized import LinearGroup
from oospec.engine.slot_rows import PROMPT, SlotFeed, add_slot_lora
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                    b.contiguous().view(torch.uint8))


@torch.inference_mode()
def outputs(model, prompt: np.ndarray, tree: TokenTree, slots: SlotFeed | None) -> list[torch.Tensor]:
    """Every hidden state of a prefill, then the tree's and the slot rows' logits of one verification."""
    ids = torch.from_numpy(prompt).view(1, -1)
    states = list(model(input_ids=ids, output_hidden_states=True).hidden_states)
    target = TargetBackend(model)
    target.reset(len(prompt) + 64)
    pending = target.prefill(prompt)
    logits, slot_logits = target.verify_rows(pending, tree, slots)
    return states + [logits] + ([slot_logits] if slot_logits is not None else [])


def compare(model, seed: int, slots: bool = False) -> tuple[int, bool]:
    """(lean layers, whether the lean and stock forwards agree bit for bit on `outputs`)."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    prompt = rng.integers(2, vocab, 80)  # more than STEP_ROWS rows: the prefill path too
    parents = np.array([-1, 0, 0, 1, 3, -1, 5])
    tree = TokenTree(rng.integers(2, vocab, len(parents)), parents)
    feed = SlotFeed(rng.integers(2, vocab, 3), np.array([PROMPT, 0, PROMPT]), 0) if slots else None
    layers = install_lean(model)
    lean = outputs(model, prompt, tree, feed)
    remove_lean(model)
    stock = outputs(model, prompt, tree, feed)
    install_lean(model)
    return layers, all(same_bits(a, b) for a, b in zip(lean, stock, strict=True))


@pytest.mark.parametrize("arch,dtype", [("qwen2", torch.float32), ("qwen2", torch.bfloat16),
                                        ("llama", torch.float32), ("llama", torch.bfloat16)], ids=str)
def test_the_lean_layer_gives_the_stock_bits(arch, dtype, tmp_path):
    model = tiny_model(arch).to(dtype)
    add_slot_lora(model, write_random_lora(tmp_path / "lora", model, scale=10.0))
    report = prepare(model)  # what every command does to a CPU target
    assert report["lean_layers"] == model.config.num_hidden_layers
    for seed in range(3):
        layers, same = compare(model, seed, slots=seed > 0)
        assert layers == model.config.num_hidden_layers and same, seed


def test_a_change_to_the_lean_layer_is_caught(monkeypatch):
    model = tiny_model("qwen2").to(torch.bfloat16)
    prepare(model)
    assert compare(model, 0)[1]
    plain = lean_layer.invariant_attention
    with monkeypatch.context() as patch:  # the lean forward's attention output, off by 1%
        patch.setattr(lean_layer, "invariant_attention", lambda *a, **k: (plain(*a, **k)[0] * 1.01, None))
        assert not compare(model, 0)[1]
    ops = model.model.layers[0].self_attn.oospec_ops
    if hasattr(ops, "rope"):  # the rotary kernel with one rounding left out: x * cos + r * sin in float32
        def unrounded(x, cos, sin):
            xf, cf, sf = x.float(), cos.float().unsqueeze(1), sin.float().unsqueeze(1)
            return (xf * cf + rotate_half(xf) * sf).to(x.dtype)
        with monkeypatch.context() as patch:
            patch.setattr(ops, "rope", unrounded)
            assert not compare(model, 0)[1]


def test_a_layer_that_is_not_the_installed_kind_keeps_the_stock_forward():
    model = tiny_model("llama")
    assert prepare(model)["lean_layers"] == model.config.num_hidden_layers
    remove_lean(model)
    model.model.layers[0].mlp.act_fn = torch.nn.SiLU()  # not the invariant SiLU: the lean forward would differ
    assert install_lean(model) == model.config.num_hidden_layers - 1
    assert "forward" not in model.model.layers[0].__dict__


def test_a_layer_whose_attention_was_replaced_since_takes_the_stock_forward():
    model = tiny_model("qwen2")
    prepare(model)
    ids = torch.arange(2, 12).view(1, -1)
    with torch.inference_mode():
        lean = model(input_ids=ids).logits
        model.config._attn_implementation = "sdpa"  # e.g. another installer; the lean forward would ignore it
        stock = model(input_ids=ids).logits
    calls = []
    model.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(1))
    with torch.inference_mode():
        model(input_ids=ids)
    assert calls, "the stock forward calls the attention module; the lean one does not"
    assert torch.allclose(lean, stock, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_gguf_target_runs_q_k_v_and_gate_up_as_one_call_each_with_the_stock_bits(dtype, one_thread):
    from oospec.engine.quantized import load_gguf_model
    from oospec.models.provision import pull_gguf

    model, _ = load_gguf_model(pull_gguf("smollm2-135m", progress=False), dtype=dtype)
    prepare(model)
    layers, same = compare(model, 7)
    assert layers == model.config.num_hidden_layers and same
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.__dict__["_oospec_group"][1], LinearGroup)  # the path under test was taken


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_gguf_target_with_a_slot_lora_groups_its_calls_with_the_stock_bits(dtype, tmp_path):
    from oospec.engine.quantized import load_gguf_model
    from oospec.engine.slot_rows import RowLoRAGroup
    from oospec.models.provision import pull_gguf

    model, _ = load_gguf_model(pull_gguf("smollm2-135m", progress=False), dtype=dtype)
    add_slot_lora(model, write_random_lora(tmp_path / "lora", model, scale=10.0))
    prepare(model)
    for seed in (3, 4):  # slot rows through a huge LoRA: the grouped deltas must be each layer's own
        layers, same = compare(model, seed, slots=True)
        assert layers == model.config.num_hidden_layers and same, seed
    layer = model.model.layers[0]
    for owner in (layer.self_attn, layer.mlp):
        assert isinstance(owner.__dict__["_oospec_group"][1], RowLoRAGroup)  # the path under test was taken


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_rotary_kernel_rounds_as_the_stock_expression(dtype):
    from oospec.engine.kernels import native

    ops = native()
    assert ops is not None, "the C++ invariant kernels did not build (see the logged reason)"
    g = torch.Generator().manual_seed(3)
    for batch, cos_batch in ((1, 1), (2, 2), (2, 1)):
        x = (torch.randn(batch, 5, 3, 16, generator=g) * 30).to(dtype).transpose(1, 2)  # [B, H, S, D], as q is
        cos = torch.randn(cos_batch, 5, 16, generator=g).to(dtype)
        sin = torch.randn(cos_batch, 5, 16, generator=g).to(dtype)
        want = (x * cos.unsqueeze(1)) + (rotate_half(x) * sin.unsqueeze(1))
        assert same_bits(ops.rope(x, cos, sin), want.contiguous()), (batch, cos_batch)


def test_the_lean_layer_on_the_pure_torch_kernels_gives_the_stock_bits():
    from oospec.engine.invariant import TorchKernels, install

    model = tiny_model("llama").to(torch.bfloat16)
    install(model, TorchKernels())  # no rotary kernel: the architecture's own apply_rotary_pos_emb
    layers, same = compare(model, 4)
    assert layers == model.config.num_hidden_layers and same
