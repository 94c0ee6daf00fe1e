"""Tool-call benchmarks carried to a GPU by replay: PROJECTED times, not measured ones.

No weights travel to a lent GPU, so the tool-call benchmarks run on the CPU, where the trace of every request is
recorded (samples.jsonl of `bench run`: the draft tokens each verification forward accepted, the tree it
verified, the sidecar's hints and the token at which they arrived). The token sequence and the acceptance of a
lossless method do not depend on the device, so the same steps would be taken on a GPU; only their price
changes. This module prices each request's steps with a GPU's measured costs (`GpuCosts`: c(k) per verification
width k, prefill time by prompt length, the sidecar's job latency) and sums them:

    projected e2e = prefill(prompt tokens) + wait for the hints + sum over steps of c(1 + tree size) + host time

What a record does not hold is never guessed silently: every fallback is named in the report's `assumptions`
(e.g. tree sizes absent: each step priced at c(1 + budget), an upper bound).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

LABEL = "PROJECTION (replay of CPU traces against measured GPU costs), not a measurement"
REFERENCE = "ar"
ORACLE = "oracle"
TOOLSPEC = "toolspec"
# Which forward's costs price the steps: of a gpu_check.json (tests/gpu_check.py) the stock or the padded forward,
# of a gpu_graph_check.json (tests/gpu_graph_check.py) the padded forward run eagerly or replayed as a CUDA graph.
FORWARDS = ("padded", "stock", "eager", "graph")


@dataclass
class ProjectionConfig:
    """What `oospec bench project` is asked to do (the CLI's defaults are these)."""

    runs: list[str] = field(default_factory=list)  # `bench run` output folders (samples.jsonl, run.json)
    costs: str = "experiments/results/gpu-h200/gpu_check.json"  # gpu_check.json or a `bench cost-curve` JSON
    shape: str = "qwen2.5-1.5b"  # the gpu_check preset whose costs price the run's target (same architecture)
    forward: str = "padded"  # the forward that the engine runs on a GPU (row-invariant)
    sidecar_job_s: float | None = None  # measured GPU job latency of the sidecar; None: hints free (see replay)
    tokenizer: str | None = None  # counts prompt tokens the records lack (default: each run's target)
    count_prompts: bool = True  # False: records without prompt_tokens priced at the curve's prompt length
    host_time: bool = True  # add each record's recorded drafting time (host work between forwards)
    out: str | None = None  # folder for projection.json and projection.md


@dataclass
class GpuCosts:
    """A GPU's measured prices: seconds per verification forward of k tokens, and prefill seconds by length."""

    device: str
    source: str
    forward_s: dict[int, float]  # k -> seconds (k = the pending token + the tree's nodes)
    prefill_s: dict[int, float]  # prompt tokens -> seconds
    sidecar_job_s: float | None = None

    def forward(self, k: int) -> float:
        """c(k), linear between measured widths; refused beyond the widest (no extrapolation of a curve)."""
        ks = sorted(self.forward_s)
        if k < ks[0] or k > ks[-1]:
            raise ValueError(f"c({k}) is outside the measured widths {ks[0]}..{ks[-1]} of {self.source}")
        return _interpolate(self.forward_s, k)

    def prefill(self, tokens: int) -> float:
        """Prefill seconds for `tokens` new prompt tokens: with one measured length, proportional to it (an upper
        bound where the GPU is host-bound and prefill barely grows); with several, linear between and beyond."""
        if tokens <= 0:
            return 0.0
        if len(self.prefill_s) == 1:
            (n, s), = self.prefill_s.items()
            return s * tokens / n
        return _interpolate(self.prefill_s, tokens, extrapolate=True)

    def prefill_rule(self) -> str:
        points = ", ".join(f"{n} tokens: {s:.4f} s" for n, s in sorted(self.prefill_s.items()))
        if len(self.prefill_s) == 1:
            return f"prefill measured at one length ({points}), scaled in proportion to each prompt's tokens"
        return f"prefill interpolated linearly between measured lengths ({points})"


def _interpolate(points: dict[int, float], x: float, extrapolate: bool = False) -> float:
    xs = sorted(points)
    if x in points:
        return points[x]
    i = bisect.bisect_left(xs, x)
    if i == 0 or i == len(xs):
        if not extrapolate:
            raise ValueError(f"{x} outside {xs[0]}..{xs[-1]}")
        i = 1 if i == 0 else len(xs) - 1
    x0, x1 = xs[i - 1], xs[i]
    return points[x0] + (points[x1] - points[x0]) * (x - x0) / (x1 - x0)


def load_costs(path: str | Path, shape: str, forward: str = "padded", sidecar_job_s: float | None = None) -> GpuCosts:
    """The costs of `shape` in a gpu_check.json (tests/gpu_check.py: `<forward>_curve` for c(k), the warm prefill of
    `<forward>_speed`), or of a `bench cost-curve --out` JSON (its `seconds` and `prefill_s`)."""
    if forward not in FORWARDS:
        raise ValueError(f"forward must be one of {FORWARDS}")
    data = json.loads(Path(path).read_text())
    if "shapes" in data:
        return _graph_check_costs(data, path, shape, forward, sidecar_job_s)
    if "presets" in data:
        entry = data["presets"].get(shape)
        if not entry or f"{forward}_curve" not in entry:
            raise ValueError(f"{path} has no {forward} cost curve for {shape} (has: {sorted(data['presets'])})")
        curve, speed = entry[f"{forward}_curve"], entry.get(f"{forward}_speed", {})
        prefill = ({int(speed["prompt"]): float(speed["prefill_s"])} if "prefill_s" in speed
                   else {int(curve["prompt_len"]): float(curve["prefill_s"])})
        device = data.get("device", curve.get("device_name", "?"))
        job = sidecar_job_s if sidecar_job_s is not None else entry.get("sidecar_job_s")
    else:
        curve = data
        prefill = {int(curve["prompt_len"]): float(curve["prefill_s"])}
        device = curve.get("device_name") or curve.get("device", "?")
        job = sidecar_job_s
    return GpuCosts(device=device, source=f"{path} [{shape}, {forward} forward]",
                    forward_s={int(k): float(v) for k, v in curve["seconds"].items()}, prefill_s=prefill,
                    sidecar_job_s=job)


def _graph_check_costs(data: dict, path, shape: str, forward: str, sidecar_job_s: float | None) -> GpuCosts:
    entry = data["shapes"].get(shape, {})
    cost, eager = entry.get(f"{forward}_cost"), entry.get("eager_cost", {})
    if not isinstance(cost, dict) or "c1_ms" not in cost or "prefill_s" not in eager:
        raise ValueError(f"{path} has no measured {forward} costs and eager prefill for {shape}")
    widths = {int(k[1:-3]): v / 1000 for k, v in cost.items() if k.startswith("c") and k.endswith("_ms")}
    sidecar = data.get("sidecar") or {}
    job = sidecar_job_s if sidecar_job_s is not None else sidecar.get("job_s")
    return GpuCosts(device=data.get("device", "?"), source=f"{path} [{shape}, {forward} forward]", forward_s=widths,
                    prefill_s={int(eager["prompt_len"]): float(eager["prefill_s"])}, sidecar_job_s=job)


def read_run(folder: str | Path) -> tuple[dict, list[dict]]:
    """(run.json, the records of samples.jsonl) of a `bench run` output folder."""
    folder = Path(folder)
    header = json.loads((folder / "run.json").read_text())
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]
    return header, records


def prompt_lengths(records: list[dict], tokenizer) -> dict[tuple[str, str], int]:
    """{(dataset label, sample id): prompt tokens}, rendered as `bench run` renders each item (Engine.encode's chat
    rendering), for records that lack `prompt_tokens`."""
    from oospec.datasets import load_dataset
    from oospec.engine.engine import render_chat
    from oospec.tools.chat_text import ClientText

    client = ClientText(tokenizer)
    wanted: dict[str, set[str]] = {}
    for r in records:
        if "prompt_tokens" not in r:
            wanted.setdefault(r["dataset"], set()).add(r["sample_id"])
    lengths = {}
    for label, ids in wanted.items():
        for sample in load_dataset(label):
            if sample.id in ids:
                text = render_chat(client, client.mark(sample.messages), client.mark(sample.chat_tools()))
                lengths[(label, sample.id)] = int(client.encode_array(text).size)
    return lengths


@dataclass
class Replay:
    """One record's projected seconds, and what the replay had to assume about it (keys of ASSUMPTIONS)."""

    prefill_s: float
    wait_s: float
    decode_s: float
    host_s: float
    forwards: int
    assumed: set[str]

    @property
    def e2e_s(self) -> float:
        return self.prefill_s + self.wait_s + self.decode_s + self.host_s


ASSUMPTIONS = {
    "tree_sizes": "records lack tree_sizes: each verification forward of a drafting method priced at "
                  "c(1 + budget), an upper bound (the tree holds at most `budget` nodes); `ar` verifies no tree, c(1)",
    "prompt_tokens": "records lack prompt_tokens and no tokenizer counted them: prefill priced at the cost curve's "
                     "measured prompt length",
    "hints_free": "no GPU sidecar job latency given: hints free (the sidecar on its own device), i.e. available "
                  "from the first decoded token, as the CPU traces recorded them",
    "hints_wait": "the sidecar job outlasts the GPU prefill: the target is priced as waiting for the hints "
                  "(an upper bound: the trace has them from the first decoded token)",
    "hints_late": "hints arrived after the first decoded token on the CPU: that trace replayed as recorded",
}


def replay(record: dict, costs: GpuCosts, budget: int, prompt_tokens: int | None, host_time: bool = True) -> Replay:
    """The projected times of one record's steps at `costs` (see the module's docstring)."""
    assumed: set[str] = set()
    accepted = record["accepted_per_step"]
    steps = record["target_forwards"] - 1  # the prefill's forward gives the first token
    plain = not accepted  # plain sampling records no steps: one token, one 1-row forward each
    if not plain and steps != len(accepted):
        raise ValueError(f"{record['sample_id']} {record['method']}: target_forwards {record['target_forwards']} is "
                         f"not 1 (prefill) + {len(accepted)} steps")
    sizes = record.get("tree_sizes")
    if plain:
        sizes = [0] * steps
    elif sizes is None or len(sizes) != steps:
        if record["method"] != REFERENCE:
            assumed.add("tree_sizes")
        sizes = [0 if record["method"] == REFERENCE else budget] * steps
    rows = record.get("slot_rows") or []  # slot rows ride in the same forwards (oospec-rows): priced with them
    rows = rows if len(rows) == len(sizes) else [0] * len(sizes)
    decode = sum(costs.forward(1 + int(s) + int(r)) for s, r in zip(sizes, rows))
    if prompt_tokens is None:
        assumed.add("prompt_tokens")
        prompt_tokens = next(iter(costs.prefill_s))
    prefill = costs.prefill(prompt_tokens - int(record.get("prompt_tokens_reused", 0)))
    wait = 0.0
    sidecar = record.get("sidecar") or {}
    if sidecar.get("submitted") and sidecar.get("arrived"):
        if int(sidecar.get("tokens_written_at_arrival", 1)) > 1:
            assumed.add("hints_late")
        elif costs.sidecar_job_s is None:
            assumed.add("hints_free")
        elif costs.sidecar_job_s > prefill:
            assumed.add("hints_wait")
            wait = costs.sidecar_job_s - prefill
    host = float(record.get("draft_s", 0.0)) if host_time else 0.0
    return Replay(prefill, wait, decode, host, steps + 1, assumed)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize(rows: list[tuple[dict, Replay]]) -> dict:
    """{dataset: {method: projected sums and speed-ups}}: ratios of summed times over the samples `ar` ran too."""
    by_ds: dict[str, dict[str, list[tuple[dict, Replay]]]] = {}
    for rec, rep in rows:
        by_ds.setdefault(rec["dataset"], {}).setdefault(rec["method"], []).append((rec, rep))
    out: dict[str, dict] = {}
    for ds, methods in by_ds.items():
        ref = {rec["sample_id"]: rep for rec, rep in methods.get(REFERENCE, [])}
        table: dict[str, dict] = {}
        for m, pairs in methods.items():
            pairs = [(rec, rep) for rec, rep in pairs if rec["sample_id"] in ref]
            if not pairs:
                continue
            base = [ref[rec["sample_id"]] for rec, _ in pairs]
            reps = [rep for _, rep in pairs]
            e2e, decode = sum(r.e2e_s for r in reps), sum(r.decode_s + r.host_s for r in reps)
            table[m] = {
                "n": len(pairs),
                "target_forwards": sum(r.forwards for r in reps),
                "new_tokens": sum(rec["new_tokens"] for rec, _ in pairs),
                "projected_prefill_s": sum(r.prefill_s for r in reps),
                "projected_wait_s": sum(r.wait_s for r in reps),
                "projected_forwards_s": sum(r.decode_s for r in reps),
                "projected_host_s": sum(r.host_s for r in reps),
                "projected_e2e_s": e2e,
                "projected_e2e_speedup": _ratio(sum(b.e2e_s for b in base), e2e),
                "projected_decode_speedup": _ratio(sum(b.decode_s + b.host_s for b in base), decode),
                "cpu_e2e_speedup": _ratio(sum(_cpu_e2e(methods[REFERENCE], rec) for rec, _ in pairs),
                                          sum(rec["e2e_s"] for rec, _ in pairs)),
                "assumptions": sorted(set().union(*(r.assumed for r in reps))),
            }
        _relative(table)
        out[ds] = table
    return out


def _cpu_e2e(ref_pairs: list[tuple[dict, Replay]], rec: dict) -> float:
    return next(r["e2e_s"] for r, _ in ref_pairs if r["sample_id"] == rec["sample_id"])


def _relative(table: dict[str, dict]) -> None:
    """Each method against the oracle's gain ((s - 1) / (s_oracle - 1), e2e) and against toolspec (e2e)."""
    oracle = table.get(ORACLE, {}).get("projected_e2e_speedup")
    tool = table.get(TOOLSPEC, {}).get("projected_e2e_s")
    for row in table.values():
        s = row["projected_e2e_speedup"]
        row["projected_oracle_fraction"] = (s - 1) / (oracle - 1) if oracle and s and oracle > 1 else None
        row["projected_vs_toolspec"] = _ratio(tool, row["projected_e2e_s"]) if tool else None


def project(cfg: ProjectionConfig, command: str | None = None) -> dict:
    """The projection of every run in `cfg.runs` at `cfg.costs`: the report `write` saves."""
    if not cfg.runs:
        raise ValueError("give at least one `bench run` output folder")
    costs = load_costs(cfg.costs, cfg.shape, cfg.forward, cfg.sidecar_job_s)
    rows: list[tuple[dict, Replay]] = []
    runs = []
    tokenizers: dict[str, object] = {}
    for folder in cfg.runs:
        header, records = read_run(folder)
        budget = int(header["budget"])
        name = cfg.tokenizer or header.get("target")
        lengths = {}
        if cfg.count_prompts and name and any("prompt_tokens" not in r for r in records):
            if name not in tokenizers:
                from oospec.models.loading import load_tokenizer

                tokenizers[name] = load_tokenizer(name)
            lengths = prompt_lengths(records, tokenizers[name])
        for r in records:
            n = r.get("prompt_tokens", lengths.get((r["dataset"], r["sample_id"])))
            rows.append((r, replay(r, costs, budget, n, cfg.host_time)))
        runs.append({"folder": str(folder), "command": header.get("command"), "target": header.get("target"),
                     "dtype": header.get("dtype"), "budget": budget, "records": len(records),
                     "prompt_tokens": ("recorded" if not lengths and all("prompt_tokens" in r for r in records)
                                       else f"counted with the tokenizer of {name}" if lengths else "unknown")})
    summary = summarize(rows)
    used = sorted(set().union(*(row["assumptions"] for t in summary.values() for row in t.values())))
    return {
        "label": LABEL,
        "command": command,
        "device": costs.device,
        "costs": {"source": costs.source, "forward_s": costs.forward_s, "prefill": costs.prefill_rule(),
                  "sidecar_job_s": costs.sidecar_job_s},
        "host_time": "each record's recorded drafting time (CPU) added" if cfg.host_time else "none added",
        "runs": runs,
        "assumptions": {k: ASSUMPTIONS[k] for k in used},
        "summary": summary,
    }
