"""Which precision the target runs in: `--dtype auto` decided by probing whole forwards, once per machine.

bfloat16 halves the bytes a CPU streams per decoded token, but it may only be used where speculative output
stays identical to plain decoding: where the forward that will run is row-invariant (`oospec.engine.invariant`).
So `load_target(name, dtype="auto")` on a CPU with native bfloat16 loads the model in bfloat16 with the
invariant kernels and probes it: random prompts, random token trees, every tree row's hidden states at every
layer and its logits compared bitwise with the same token's 1-row forward. Only a model that passes runs in
bfloat16; anything else runs in float32. The verdict is cached per processor, torch, kernels and model in
`$OOSPEC_HOME/dtype-verdicts.json`, and said in one line.
"""

from __future__ import annotations

import hashlib
import platform
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oospec.engine import padded
from oospec.engine.invariant import STEP_ROWS, install
from oospec.engine.lean_layer import install_lean
from oospec.engine.target import TargetBackend
from oospec.engine.tree import ROOT, TokenTree

# Tree sizes of the probe (rows of the verification forward = nodes + 1): the largest default budget's tree
# and a small one; random shapes, a fresh random prompt each.
PROBE_TREES = (16, 4, 9)
PROBE_PROMPT = 24


@dataclass(frozen=True)
class ProbeResult:
    invariant: bool
    detail: str  # where the first difference was, or what was compared


def random_tree(rng: np.random.Generator, nodes: int, vocab: int) -> TokenTree:
    """`nodes` random tokens, each below a random earlier node or the root: chains, fans and everything between."""
    parents = np.array([ROOT] + [int(rng.integers(ROOT, i)) for i in range(1, nodes)], dtype=np.int32)
    return TokenTree(rng.integers(0, vocab, nodes), parents)


def _forward(target: TargetBackend, pending: int, tree: TokenTree) -> list[torch.Tensor]:
    """Hidden states after every layer, then the logits, of one verification forward (rows: pending, nodes)."""
    out = target.verify_outputs(pending, tree, hidden_states=True)
    return [h[0] for h in out.hidden_states] + [out.logits[0]]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                      b.contiguous().view(torch.uint8))


@torch.inference_mode()
def probe(model, *, trees: tuple[int, ...] = PROBE_TREES, prompt_len: int = PROBE_PROMPT, seed: int = 0) -> ProbeResult:
    """Is every row of a tree verification forward bitwise the 1-row forward of its token, at every layer?"""
    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(seed)
    target = TargetBackend(model, prefill_chunk=0)
    compared = 0
    for case, nodes in enumerate(trees):
        nodes = min(nodes, STEP_ROWS - 1)
        prompt = rng.integers(0, vocab, prompt_len)
        tree = random_tree(rng, nodes, vocab)
        target.reset(prompt_len + nodes + 2)
        pending = target.prefill(prompt)
        saved = target.save_prefix(prompt_len)
        wide = _forward(target, pending, tree)
        path_of = {-1: []}
        for j, parent in enumerate(tree.parents):
            path_of[j] = path_of[int(parent)] + [j]
        leaves = sorted(set(range(nodes)) - set(int(p) for p in tree.parents)) or [-1]
        seen = set()
        for leaf in leaves:
            target.reset(prompt_len + nodes + 2)
            target.load_prefix(saved, prompt_len)
            token, row = pending, 0
            for node in [None] + path_of[leaf]:
                if node is not None:
                    token, row = int(tree.tokens[node]), node + 1
                narrow = _forward(target, token, TokenTree.empty())
                target.commit(np.empty(0, dtype=np.int64))
                if row in seen:
                    continue
                seen.add(row)
                for layer, (w, n) in enumerate(zip(wide, narrow)):
                    if not _same_bits(w[row], n[0]):
                        where = "logits" if layer == len(wide) - 1 else f"hidden states after layer {layer}"
                        return ProbeResult(False, f"tree {case} ({nodes} nodes), row {row}: {where} differ")
                compared += 1
    return ProbeResult(True, f"{compared} rows of {len(trees)} random trees bitwise equal at every layer")


VERDICTS = "dtype-verdicts.json"  # in oospec's cache (oospec.models.provision.read_record)


def _verdict_key(source: Path) -> str:
    """A model folder's or GGUF's verdict key: the processor, torch, the kernels' build and the model."""
    from oospec.engine.kernels import build_key
    from oospec.models.cpu_features import cpu_model

    if source.is_file():  # a GGUF: its path and size (the kernels' build key covers how it is read)
        config = str(source.stat().st_size).encode()
    else:
        config = (source / "config.json").read_bytes() if (source / "config.json").is_file() else b""
    model = hashlib.sha256(str(source.resolve()).encode() + config).hexdigest()[:16]
    return f"{cpu_model()} | {platform.machine()} | torch {torch.__version__} | kernels {build_key()} | model {model}"


# The probe's prompt on an accelerator: longer than one block of the row-wise attention (oospec.engine.padded),
# so the trees start inside a block rather than at its edge.
PADDED_PROBE_PROMPT = 100


def prepare(model, optimize: bool = True) -> dict:
    """The target's invariant forward where supported: the CPU kernels (`oospec.engine.invariant.install`),
    on CUDA padded forwards with row-wise attention (`oospec.engine.padded.install`)."""
    if not optimize:
        return {"applied": False, "reason": "optimize=False", "kernels": None}
    if next(model.parameters()).device.type != "cpu":
        return padded.install(model)
    report = install(model)
    if report["applied"] and "lean_layers" not in report:  # the same bits with less Python per layer
        report["lean_layers"] = install_lean(model)
    return report


def _load_accelerator(name_or_path, dtype: str, device: str, optimize: bool, say):
    """An accelerator's target (`dtype="auto"`: bfloat16) with the padded invariant forward, probed bitwise on
    this device; a forward that is not invariant (or could not be made so) is said in a BatchVarianceWarning."""
    from oospec.models.cpu_features import auto_dtype
    from oospec.models.loading import BatchVarianceWarning, load_model

    model, tokenizer = load_model(name_or_path, dtype=auto_dtype(device) if dtype == "auto" else dtype, device=device)
    report = prepare(model, optimize)
    if report["applied"]:
        result = probe(model, prompt_len=PADDED_PROBE_PROMPT)
        note = f"{report['kernels']}: {result.detail}"
    else:
        result, note = ProbeResult(False, report["reason"]), f"no invariant forward ({report['reason']})"
    if not result.invariant:
        warnings.warn(f"the target's forward on {device} is not row-invariant ({result.detail}): speculative output "
                      "can differ from plain greedy decoding here", BatchVarianceWarning, stacklevel=3)
    if dtype == "auto":
        say(f"--dtype auto: {model.dtype} on {device}; {note}")
    return model, tokenizer, note


def _loader(source: Path, device: str):
    """dtype name -> (model, tokenizer) for `source`: a GGUF through the quantized loader (its weights kept in
    their blocks), a folder through transformers."""
    from oospec.models.loading import load_model

    if source.suffix.lower() == ".gguf":
        from oospec.engine.quantized import load_gguf_model

        return lambda dtype: load_gguf_model(source, dtype=getattr(torch, dtype))
    return lambda dtype: load_model(source, dtype=dtype, device=device)


def load_target(name_or_path, *, dtype: str = "auto", device: str = "cpu", optimize: bool = True, say=None):
    """(model, tokenizer, note) for a target: `dtype="auto"` resolved as the module docstring says. On a CPU a
    known model runs from its GGUF (`provision.resolve_target`), as does a `.gguf` path.

    say: called with the one-line note on what auto chose (default: printed to stderr)."""
    from oospec.engine.kernels import native
    from oospec.models.cpu_features import native_bf16
    from oospec.models.loading import BatchVarianceWarning
    from oospec.models.provision import oospec_home, read_record, resolve_target, write_record

    say = say or (lambda line: print(line, file=sys.stderr))
    if not str(device).startswith("cpu"):
        return _load_accelerator(name_or_path, dtype, device, optimize, say)
    source = resolve_target(name_or_path)
    load = _loader(source, device)
    if dtype != "auto":
        model, tokenizer = load(dtype)
        report = prepare(model, optimize)
        if dtype == "bfloat16" and native_bf16() and not report["applied"]:
            warnings.warn(f"bfloat16 without the invariant kernels ({report['reason']}) runs oneDNN's native kernels, "
                          "whose results depend on how many tokens a forward holds: speculative output can differ "
                          "from plain greedy decoding here", BatchVarianceWarning, stacklevel=2)
        return model, tokenizer, ""
    flag = native_bf16()
    why_not = ("this CPU has no native bfloat16" if flag is None else "optimize is off" if not optimize
               else "the C++ invariant kernels are not built" if native() is None else "")
    if why_not:
        model, tokenizer = load("float32")
        prepare(model, optimize)
        return model, tokenizer, f"--dtype auto: float32 ({why_not})"
    key = _verdict_key(source)
    cached = read_record(VERDICTS).get(key)
    if cached is None or cached.get("dtype") == "bfloat16":
        model, tokenizer = load("bfloat16")
        report = prepare(model)
        if cached is None:
            result = probe(model) if report["applied"] else ProbeResult(False, f"not installed: {report['reason']}")
            cached = {"dtype": "bfloat16" if result.invariant else "float32", "detail": result.detail}
            write_record(VERDICTS, key, cached)
        if cached["dtype"] == "bfloat16":
            note = (f"--dtype auto: bfloat16 ({flag}; invariant forward probed: {cached['detail']}; "
                    f"cached in {oospec_home() / VERDICTS})")
            say(note)
            return model, tokenizer, note
        del model
    model, tokenizer = load("float32")
    prepare(model)
    note = f"--dtype auto: float32 (bfloat16 failed the invariance probe: {cached['detail']})"
    say(note)
    return model, tokenizer, note
