"""The invariant forward: a row's bits do not depend on how many rows share its forward, in both dtypes, with
the C++ kernels and with the pure-torch ones; the probe behind `--dtype auto` sees it, and rejects a kernel
that breaks it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import VOCAB, tiny_model

from oospec.engine import invariant
from oospec.engine.invariant import STEP_ROWS, TorchKernels, install
from oospec.engine.kernels import native
from oospec.engine.precision import probe, random_tree
from oospec.engine.target import TargetBackend
from oospec.engine.tree import TokenTree

DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture(scope="module")
def cxx():
    module = native()
    # make venv builds them; a machine without a compiler would use the pure-torch kernels, but the fast suite
    # must say so rather than test one kind twice
    assert module is not None, "the C++ invariant kernels did not build (see the logged reason)"
    return module


@pytest.fixture(scope="module", params=["c++", "torch"])
def ops(request, cxx):
    return cxx if request.param == "c++" else TorchKernels()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(40, 13), (64, 37), (1536 // 8, 67)])
def test_linear_rows_do_not_depend_on_the_row_count(ops, dtype, shape):
    k, n = shape  # odd sizes: tails of the lane blocks, short last output blocks
    g = torch.Generator().manual_seed(k * n)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    x = torch.randn(17, k, generator=g).to(dtype)
    full = ops.linear(x, w, b)
    for m in range(1, 17):
        assert same_bits(ops.linear(x[:m].contiguous(), w, b), full[:m]), f"rows 0..{m} differ"
    assert same_bits(ops.linear(x[5:6].contiguous(), w, b), full[5:6])  # a row alone, wherever it sat
    ref = x.double() @ w.double().T + b.double()
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert torch.allclose(full.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_linear_bits_do_not_depend_on_the_thread_count(cxx):
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(301, 96, generator=g), torch.randn(9, 96, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cxx.linear(x, w, None)
        torch.set_num_threads(2)
        two = cxx.linear(x, w, None)
    finally:
        torch.set_num_threads(before)
    assert same_bits(one, two)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(40, 13), (37, 67), (1537, 33), (96, 301)])
def test_packed_linear_is_the_plain_call_for_every_row_count(cxx, dtype, shape):
    """The panels packed once at load (pack_linear) give the plain-weight call's bits for 1..17 rows (one, two
    and three row blocks, uneven ones) and odd K and N (the tails of the 16-column panels and bfloat16 pairs)."""
    k, n = shape
    g = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    x = torch.randn(17, k, generator=g).to(dtype)
    packed = cxx.pack_linear(w)
    full = cxx.linear_packed(x, packed, b, n)
    assert same_bits(full, cxx.linear(x, w, b))
    for m in range(1, 18):
        assert same_bits(cxx.linear_packed(x[:m].contiguous(), packed, b, n), full[:m]), f"rows 0..{m} differ"
        assert same_bits(cxx.linear_packed(x[m - 1:m].contiguous(), packed, b, n), full[m - 1:m]), f"row {m - 1}"
    ref = x.double() @ w.double().T + b.double()
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert torch.allclose(full.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_install_packs_each_weight_once_and_a_tied_head_stays_one_matrix(cxx, dtype):
    model = tiny_model("qwen2").to(dtype)  # tied embeddings
    embedding = model.model.embed_tokens.weight.detach().clone()
    install(model, cxx)
    head = model.lm_head
    assert head.weight is None and head.packed is not None
    assert model.model.embed_tokens.packed is head.packed  # the input embedding reads the head's panels
    ids = torch.tensor([[0, 1, 15, 16, 17, VOCAB - 1]])
    assert same_bits(model.model.embed_tokens(ids), embedding[ids])
    assert all(lin.weight is None for lin in model.model.layers[0].mlp.children() if hasattr(lin, "packed"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_row_sees_the_same_keys_alone_or_in_a_masked_tree(ops, dtype):
    """A tree node attends to the prefix and its ancestors among masked siblings; decoded alone, the same keys
    sit in consecutive slots. Both must give the same bits."""
    g = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, prefix = 4, 2, 24, 30
    rng = np.random.default_rng(0)
    tree = random_tree(rng, 12, VOCAB)
    q = torch.randn(heads, 13, dim, generator=g).to(dtype)
    k = torch.randn(kv_heads, prefix + 13, dim, generator=g).to(dtype)
    v = torch.randn(kv_heads, prefix + 13, dim, generator=g).to(dtype)
    valid = torch.zeros(13, prefix + 13, dtype=torch.uint8)
    valid[:, :prefix] = 1
    valid[:, prefix:] = torch.from_numpy(tree.ancestor_mask()).to(torch.uint8)
    wide = ops.attention(q, k, v, valid, dim ** -0.5)
    for row in range(13):
        seen = valid[row].nonzero().view(-1)
        alone = ops.attention(q[:, row:row + 1].contiguous(), k[:, seen].contiguous(), v[:, seen].contiguous(),
                              torch.empty(0, dtype=torch.uint8), dim ** -0.5)
        assert same_bits(alone[0], wide[row]), f"row {row}"
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(2, 0), v.float().repeat_interleave(2, 0), attn_mask=valid.bool())
    assert torch.allclose(wide.float().transpose(0, 1), ref, atol=0.02 if dtype == torch.bfloat16 else 1e-5)


def test_cxx_and_torch_exp_and_silu_are_one_formula(cxx):
    """The fallback computes exp (and so SiLU) with the same IEEE operations as the C++ code: the same bits."""
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.randn(5000) * 10, torch.tensor([0.0, -0.0, 1e-30])])
    assert same_bits(cxx.exp_fixed(x), invariant.exp_fixed(x))
    assert torch.allclose(invariant.exp_fixed(x.clamp(-80, 80)).double(), x.clamp(-80, 80).double().exp(), rtol=5e-7)
    for dtype in DTYPES:
        assert same_bits(cxx.silu(x.to(dtype)), TorchKernels().silu(x.to(dtype)))


def test_vector_and_one_by_one_exp_give_the_same_bits(cxx):
    """exp16 (16 lanes) and exp_fixed (one element) are one formula: the clamp, NaN, infinities, signed zeros,
    subnormals and the rounding ties of the reduction included. SiLU takes both paths within one call (blocks
    of 16, then the tail), so shifting the input by one element moves values between them."""
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-45, 1e-38, -87.0,
                            -87.00001, 88.0, 88.00001, 0.5 / 1.44269504088896341, 1.5 / 1.44269504088896341,
                            -103.0, 1e30, -1e30])
    x = torch.cat([special, torch.randn(4099) * 30, torch.linspace(-90, 90, 4001)])
    assert same_bits(cxx.exp_fixed(x, vector=True), cxx.exp_fixed(x, vector=False))
    for dtype in DTYPES:
        xs = x.to(dtype)
        whole = cxx.silu(xs)
        for shift in (1, 7):
            assert same_bits(cxx.silu(xs[shift:].contiguous()), whole[shift:])


def test_rms_norm_matches_transformers_closely_and_is_row_wise(ops):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(48, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(9, 48)
    out = ops.rms_norm(x, norm.weight.detach(), 1e-5)
    assert torch.allclose(out, norm(x).detach(), atol=1e-5)
    assert same_bits(ops.rms_norm(x[3:4].contiguous(), norm.weight.detach(), 1e-5), out[3:4])


def installed(arch: str, dtype, ops):
    model = tiny_model(arch).to(dtype)
    assert install(model, ops)["applied"]
    return model


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_tree_row_is_bitwise_its_one_row_forward(ops, arch, dtype):
    """k = 2..17 rows (the default budget's trees), random prompts and random trees: logits equal bit for bit."""
    model = installed(arch, dtype, ops)
    target = TargetBackend(model, prefill_chunk=16)
    rng = np.random.default_rng(3)
    for k in range(2, 18):
        prompt = rng.integers(0, VOCAB, int(rng.integers(3, 40)))
        tree = random_tree(rng, k - 1, VOCAB)
        target.reset(prompt.size + k + 2)
        pending = target.prefill(prompt)
        saved = target.save_prefix(prompt.size)
        wide = target.verify_logits(pending, tree)
        for node in range(-1, k - 1):
            path = [] if node < 0 else list(tree.path_to(node))
            target.reset(prompt.size + k + 2)
            target.load_prefix(saved, prompt.size)
            token = pending
            for step in [None] + path:
                if step is not None:
                    token = int(tree.tokens[step])
                row = target.verify_logits(token, TokenTree.empty())[0]
                target.commit(np.empty(0, dtype=np.int64))
            assert same_bits(row, wide[node + 1]), f"k={k}, node {node}"


def test_chunked_prefill_is_bitwise_one_forward_within_step_rows(cxx):
    """Inside the invariant path, chunking the prompt changes nothing: each row's reductions are its own."""
    model = installed("qwen2", torch.float32, cxx)
    prompt = np.random.default_rng(4).integers(0, VOCAB, 50)
    logits = []
    for chunk in (0, 7, 16):
        target = TargetBackend(model, prefill_chunk=chunk)
        target.reset(60)
        logits.append(target.prefill_logits(prompt))
    assert same_bits(logits[0], logits[1]) and same_bits(logits[0], logits[2])


class RowCountKernels(TorchKernels):
    """A deliberately broken kernel: the last bit of every output depends on whether the forward had one row."""

    def linear(self, x, w, bias):
        y = super().linear(x, w, bias)
        return y if x.shape[0] == 1 else torch.nextafter(y, torch.full_like(y, float("inf")))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_probe_accepts_the_invariant_forward_and_rejects_a_row_dependent_kernel(cxx, dtype):
    good = probe(installed("qwen2", dtype, cxx), trees=(6, 3), prompt_len=12)
    assert good.invariant, good.detail
    bad = probe(installed("qwen2", dtype, RowCountKernels()), trees=(6, 3), prompt_len=12)
    assert not bad.invariant and "differ" in bad.detail


def test_trees_are_capped_at_the_invariant_row_limit(cxx):
    model = installed("llama", torch.float32, cxx)
    assert TargetBackend(model).max_tree_nodes == STEP_ROWS - 1
    assert TargetBackend(tiny_model("llama")).max_tree_nodes is None


def test_install_refuses_what_it_cannot_make_invariant():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50))
    assert "architecture" in install(gpt2)["reason"]
    half = tiny_model("qwen2").half()
    assert "dtype" in install(half)["reason"]


def test_auto_dtype_probes_once_then_reads_the_verdict(smollm2_path, home, monkeypatch):
    """On a CPU with native bfloat16 and the C++ kernels, auto probes the bfloat16 forward, keeps the verdict,
    and the next load reads it; a failed probe means float32. Flags faked so this runs on every CPU."""
    from oospec.engine import precision
    from oospec.models import cpu_features

    monkeypatch.setattr(cpu_features, "this_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    lines = []
    model, _, note = precision.load_target(smollm2_path, dtype="auto", say=lines.append)
    assert next(model.parameters()).dtype == torch.bfloat16 and "bfloat16" in note and lines == [note]
    verdicts = json.loads((home / "dtype-verdicts.json").read_text())
    assert [v["dtype"] for v in verdicts.values()] == ["bfloat16"]

    def no_probe(*args, **kwargs):
        raise AssertionError("the cached verdict should have been used")

    monkeypatch.setattr(precision, "probe", no_probe)
    model, _, _ = precision.load_target(smollm2_path, dtype="auto", say=lines.append)
    assert next(model.parameters()).dtype == torch.bfloat16

    (home / "dtype-verdicts.json").unlink()
    monkeypatch.setattr(precision, "probe", lambda model: precision.ProbeResult(False, "row 3: logits differ"))
    model, _, note = precision.load_target(smollm2_path, dtype="auto", say=lines.append)
    assert next(model.parameters()).dtype == torch.float32 and "row 3: logits differ" in note

    monkeypatch.setattr(cpu_features, "this_cpu_flags", lambda: frozenset({"avx2"}))
    model, _, note = precision.load_target(smollm2_path, dtype="auto", say=lines.append)
    assert next(model.parameters()).dtype == torch.float32 and "no native bfloat16" in note


def test_a_finished_build_loads_past_a_lock_left_by_a_killed_process(cxx, tmp_path, monkeypatch):
    # A Ctrl-C while torch's cpp_extension held the build lock used to leave every later load waiting forever.
    import shutil
    import threading
    from pathlib import Path

    from oospec.engine import kernels

    key = kernels.build_key()
    folder = tmp_path / key
    folder.mkdir()
    shutil.copy(Path(cxx.__file__), folder / f"oospec_invariant_{key}.so")
    (folder / "lock").touch()
    monkeypatch.setenv("OOSPEC_KERNELS_DIR", str(tmp_path))
    loaded = []
    worker = threading.Thread(target=lambda: loaded.append(kernels.native.__wrapped__()), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert loaded and loaded[0] is not None, "the finished build was not loaded within 60 s"
    x, w = torch.randn(3, 40), torch.randn(5, 40)
    assert torch.equal(loaded[0].linear(x, w, None), cxx.linear(x, w, None))


def test_a_stale_build_lock_is_cleared_and_a_fresh_one_kept(tmp_path):
    import os
    import time

    from oospec.engine.kernels import STALE_LOCK_S, _clear_stale_lock

    fresh, stale = tmp_path / "fresh", tmp_path / "stale"
    fresh.touch()
    stale.touch()
    old = time.time() - STALE_LOCK_S - 5
    os.utime(stale, (old, old))
    _clear_stale_lock(fresh)
    _clear_stale_lock(stale)
    _clear_stale_lock(tmp_path / "absent")
    assert fresh.exists() and not stale.exists()


@pytest.mark.parametrize("shape", [(77, 40), (1536 // 4, 56), (96, 33)])
def test_bf16_linear_rows_hold_across_tile_blocks_and_prefill_sizes(cxx, shape):
    """bfloat16 up to and past the 16-row tile, the 32-row block pair and STEP_ROWS (a prefill): every row is
    its 1-row call's bits, on whichever path this CPU runs (AMX tiles or VDPBF16PS); K not a multiple of 32
    exercises the zero-padded last k-tile."""
    k, n = shape
    g = torch.Generator().manual_seed(k * 7 + n)
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    x = torch.randn(100, k, generator=g).bfloat16()
    packed = cxx.pack_linear(w)
    full = cxx.linear_packed(x, packed, b, n)
    for m in list(range(1, 41)) + [47, 63, 64, 65, 99]:
        assert same_bits(cxx.linear_packed(x[:m].contiguous(), packed, b, n), full[:m]), f"rows 0..{m} differ"
    for r in (0, 15, 16, 31, 32, 33, 99):
        assert same_bits(cxx.linear_packed(x[r:r + 1].contiguous(), packed, b, n), full[r:r + 1]), f"row {r}"
    ref = x.double() @ w.double().T + b.double()
    assert torch.allclose(full.double(), ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def test_isa_levels_put_amx_first_only_where_the_cpu_has_it():
    from oospec.engine.kernels import isa_flags

    base = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma", "avx2"}
    assert "-mamx-bf16" in isa_flags(frozenset(base | {"amx_tile", "amx_bf16"}))
    assert "-mamx-bf16" not in isa_flags(frozenset(base | {"amx_tile"}))  # no bf16 tiles: VDPBF16PS
    assert "-mamx-tile" not in isa_flags(frozenset(base)) and "-mavx512bf16" in isa_flags(frozenset(base))
    assert isa_flags(frozenset({"avx2", "fma"})) == ("-mavx2", "-mfma", "-mf16c")


_PATH_SCRIPT = """
import torch
from oospec.engine.kernels import native
ops = native()
g = torch.Generator().manual_seed(3)
w = torch.randn(200, 160, generator=g).bfloat16(); x = torch.randn(20, 160, generator=g).bfloat16()
p = ops.pack_linear(w); full = ops.linear_packed(x, p, None, 200)
ok = all(torch.equal(ops.linear_packed(x[:m].contiguous(), p, None, 200), full[:m]) for m in range(1, 21))
torch.save({"isa": ops.isa(), "ok": ok, "y": full}, OUT)
"""


def test_no_amx_keeps_a_process_on_the_vector_path_with_its_own_guarantee(cxx, tmp_path):
    """OOSPEC_NO_AMX=1 runs bfloat16 on VDPBF16PS (or its order) even on an AMX CPU: still row-invariant, and
    both paths approximate one product; on a CPU without AMX the two processes run the same path, same bits."""
    import os
    import subprocess
    import sys

    results = {}
    for name, extra in (("default", {}), ("no_amx", {"OOSPEC_NO_AMX": "1"})):
        out = tmp_path / f"{name}.pt"
        env = {k: v for k, v in os.environ.items() if k != "OOSPEC_NO_AMX"} | extra
        subprocess.run([sys.executable, "-c", _PATH_SCRIPT.replace("OUT", repr(str(out)))], check=True, env=env, timeout=300)
        results[name] = torch.load(out)
    assert results["default"]["ok"] and results["no_amx"]["ok"]
    assert results["default"]["isa"] == cxx.isa() and results["no_amx"]["isa"] != "amx_bf16"
    a, b = results["default"]["y"].double(), results["no_amx"]["y"].double()
    if results["default"]["isa"] != "amx_bf16":
        assert torch.equal(a, b)
    assert torch.allclose(a, b, rtol=0.02, atol=0.02 * b.abs().max().item())
