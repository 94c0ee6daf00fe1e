"""How a GGUF becomes a target or a sidecar: the lean header reader against gguf-py's, where a model name or a path
resolves to, `models pull` keeping the GGUF only, and a LoRA kept unmerged beside quantized weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from oospec.engine.quantized import LoRALinear, QuantizedLinear, add_lora, load_gguf_model
from oospec.errors import ModelIntegrityError
from oospec.models.gguf_weights import GGUFFile

SMOLLM2 = "smollm2-135m"


@pytest.fixture(scope="module")
def smollm2_gguf():
    from oospec.models.provision import pull_gguf

    return pull_gguf(SMOLLM2, progress=False)


def test_the_lean_reader_finds_what_gguf_py_finds(smollm2_gguf):
    ours, theirs = GGUFFile(smollm2_gguf), GGUFReader(smollm2_gguf, "r")
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type and mine.raw.nbytes == t.n_bytes
        assert mine.raw.ctypes.data - ours.data.ctypes.data == t.data_offset
        assert mine.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
    for key in ("general.architecture", "llama.block_count", "tokenizer.ggml.tokens", "tokenizer.chat_template"):
        assert ours.field(key) == theirs.get_field(key).contents(), key
    assert ours.field("no.such.key", "default") == "default"


def test_a_file_that_is_not_a_gguf_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)  # a header cut short
    with pytest.raises(ModelIntegrityError, match="not a readable GGUF"):
        GGUFFile(bad)
    bad.write_bytes(b"PK\x03\x04" + b"\x00" * 60)
    with pytest.raises(ModelIntegrityError, match="no GGUF magic"):
        GGUFFile(bad)


def test_names_and_paths_resolve_to_what_runs(smollm2_gguf, smollm2_path, tmp_path):
    from oospec.errors import ModelNotFoundError
    from oospec.models.provision import resolve_target

    assert resolve_target(SMOLLM2) == smollm2_gguf  # a known model: its verified GGUF, nothing expanded
    assert resolve_target(str(smollm2_gguf)) == smollm2_gguf.resolve()
    assert resolve_target(smollm2_path) == smollm2_path.resolve()  # a folder: as before
    with pytest.raises(ModelNotFoundError):
        resolve_target(str(tmp_path / "missing.gguf"))


def test_models_pull_keeps_the_gguf_and_expands_only_when_asked(monkeypatch, capsys):
    from oospec.cli import main
    from oospec.models import provision

    calls = []
    monkeypatch.setattr(provision, "pull_gguf", lambda name, **kw: calls.append(("gguf", name)) or "g.gguf")
    monkeypatch.setattr(provision, "pull", lambda name, **kw: calls.append(("expand", name, kw.get("keep_gguf")))
                        or "folder")
    main(["models", "pull", SMOLLM2])
    main(["models", "pull", SMOLLM2, "--expand"])
    assert calls == [("gguf", SMOLLM2), ("expand", SMOLLM2, True)]


def _write_adapter(folder, model, r=4, alpha=8, **config):
    """A peft-format LoRA over q_proj and down_proj of every layer, random factors."""
    from safetensors.torch import save_file

    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    factors = {}
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear) and name.endswith(("q_proj", "down_proj")):
            factors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(r, module.in_features, generator=g) * 0.1
            factors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(module.out_features, r, generator=g) * 0.1
    save_file(factors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha, "bias": "none", **config}))
    return factors


def test_a_lora_stays_beside_the_quantized_weights_as_peft_computes_it_unmerged(smollm2_gguf, tmp_path):
    model, _ = load_gguf_model(smollm2_gguf, dtype=torch.float32)
    factors = _write_adapter(tmp_path / "adapter", model)
    layer = model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(1))
    base = layer(x)
    assert add_lora(model, tmp_path / "adapter") == 2 * model.config.num_hidden_layers
    wrapped = model.model.layers[0].self_attn.q_proj
    assert isinstance(wrapped, LoRALinear) and wrapped.base is layer
    a = factors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = factors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert torch.equal(wrapped(x), base + (x @ a.T) @ b.T * 2.0)  # alpha / r
    assert isinstance(model.model.layers[0].self_attn.k_proj, QuantizedLinear)  # untargeted layers untouched
    with torch.inference_mode():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_a_lora_the_quantized_loader_cannot_compute_is_refused(smollm2_gguf, tmp_path):
    model, _ = load_gguf_model(smollm2_gguf, dtype=torch.float32)
    _write_adapter(tmp_path / "dora", model, use_dora=True)
    with pytest.raises(ModelIntegrityError, match="plain LoRA only"):
        add_lora(model, tmp_path / "dora")
    other = tmp_path / "other"
    other.mkdir()
    from safetensors.torch import save_file

    save_file({"base_model.model.nothing.lora_A.weight": torch.zeros(1, 1)}, str(other / "adapter_model.safetensors"))
    (other / "adapter_config.json").write_text(json.dumps({"r": 1, "lora_alpha": 1}))
    with pytest.raises(ModelIntegrityError, match="names a layer of this model"):
        add_lora(model, other)
    assert np.isfinite(model.lm_head.weight_blocks.lookup(torch.tensor([0])).numpy()).all()
