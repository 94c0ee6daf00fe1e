"""`oospec bench vllm`: the same chats in vLLM with no speculation, vLLM's ngram, oospec's proposer (without
and with the sidecar) and the oracle proposer (the ceiling), one request at a time and `--concurrency` at once.

Each setting runs in its own process (run.py) on the same machine, one after another; speed-ups are against
vLLM without speculation at the same concurrency, in the same run. Written to the output folder:
`<setting>@<concurrency>.json` (ids and timings per chat), `summary.json` as
{dataset: {method: {n, tau, e2e_speedup, decode_speedup, oracle_fraction, identical_rate, diverged_at,
throughput_tok_s}}} (diverged_at: {chat id: index of its first output token unlike no speculation's}; method:
setting, plus `@8` for the concurrent runs; throughput is the whole run's, over all its datasets) and
`summary.png`. Run it from .venv-vllm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from oospec.integrations.vllm.run import SETTINGS, run_identity

DEFAULT_SETTINGS = "none,ngram,oospec,oospec-sidecar,oracle"


def run_setting(setting: str, concurrency: int, args, out: Path, reference: Path | None) -> Path:
    path = out / f"{setting}@{concurrency}.json"
    if args.resume and path.is_file():
        want = run_identity(SimpleNamespace(**{**vars(args), "setting": setting, "concurrency": concurrency}))
        got = json.loads(path.read_text())
        if {k: got.get(k) for k in want} == want:
            print(f"[bench vllm] {setting} x{concurrency}: reusing {path}", file=sys.stderr, flush=True)
            return path
        print(f"[bench vllm] {setting} x{concurrency}: {path} was run otherwise; running again", file=sys.stderr)
    cmd = [sys.executable, "-m", "oospec.integrations.vllm.run", "--setting", setting, "--model", args.model,
           "--limit", str(args.limit), "--offset", str(args.offset), "--dtype", args.dtype, "--k", str(args.k),
           "--concurrency", str(concurrency), "--max-new-tokens", str(args.max_new_tokens), "--out", str(path)]
    for name in args.dataset:
        cmd += ["--dataset", name]
    if setting == "oracle":
        cmd += ["--reference", str(reference)]
    if args.enforce_eager:
        cmd.append("--enforce-eager")
    print(f"[bench vllm] {setting} x{concurrency}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    return path


def first_difference(tokens: list[int], reference: list[int]) -> int:
    """The index of the first output token that differs from the reference's (or where one output ends)."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def summarize(runs: dict[tuple[str, int], dict]) -> dict:
    summary: dict = {}
    for (setting, conc), run in runs.items():
        base = runs[("none", conc)]
        oracle = runs.get(("oracle", conc))
        method = setting if conc == 1 else f"{setting}@{conc}"
        for dataset in sorted({it["dataset"] for it in run["items"].values()}):
            ids = [k for k, it in run["items"].items() if it["dataset"] == dataset]

            def total(r, key, ids=ids):
                return sum(r["items"][k][key] or 0.0 for k in ids)

            e2e, e2e0 = total(run, "e2e_s"), total(base, "e2e_s")
            diverged = {k: first_difference(run["items"][k]["tokens"], base["items"][k]["tokens"]) for k in ids
                        if run["items"][k]["tokens"] != base["items"][k]["tokens"]}
            gain_oracle = e2e0 - total(oracle, "e2e_s") if oracle else None
            run_tokens = sum(len(it["tokens"]) for it in run["items"].values())
            summary.setdefault(dataset, {})[method] = {
                "n": len(ids),
                "tau": round(sum(run["items"][k]["tau"] for k in ids) / len(ids), 3),
                "e2e_speedup": round(e2e0 / e2e, 3) if e2e else None,
                "decode_speedup": round(total(base, "decode_s") / total(run, "decode_s"), 3)
                if total(run, "decode_s") else None,
                "oracle_fraction": round((e2e0 - e2e) / gain_oracle, 3) if gain_oracle else None,
                "identical_rate": round(sum(k not in diverged for k in ids) / len(ids), 3),
                "diverged_at": diverged,
                # Output tokens per second of wall time over the whole run (all its datasets, all in flight).
                "throughput_tok_s": round(run_tokens / run["wall_s"], 2) if run.get("wall_s") else None,
            }
    return summary


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summary), figsize=(6 * len(summary), 4), squeeze=False)
    for ax, (dataset, methods) in zip(axes[0], summary.items()):
        names = list(methods)
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [methods[m]["e2e_speedup"] or 0 for m in names], 0.4, label="end to end")
        ax.bar([x + 0.2 for x in xs], [methods[m]["decode_speedup"] or 0 for m in names], 0.4, label="decode phase")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(list(xs), names, rotation=30, ha="right")
        ax.set_title(f"{dataset}: speed-up over vLLM without speculation")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_settings(text: str) -> list[str]:
    """A comma list of settings, `none` (the reference of every speed-up) first."""
    settings = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown setting(s) {unknown}; choose from {', '.join(SETTINGS)}")
    return ["none"] + [s for s in dict.fromkeys(settings) if s != "none"]


def trained_chats(args) -> list[dict]:
    """The chats the sidecar's adapter (the shipped one, as the oospec-sidecar setting starts it) does not hold out
    from its training data, by content: warned about and listed in trained_items.json (its hints there are recall)."""
    from oospec.integrations.vllm.run import load_chats
    from oospec.sidecar.process import SidecarSettings, resolve_adapter
    from oospec.sidecar.provenance import describe, not_held_out

    sidecar = SidecarSettings()
    chats = load_chats(args.dataset, args.limit, args.offset)
    adapter = resolve_adapter(sidecar.model, sidecar.adapter)
    trained = not_held_out(adapter, [s.provenance_request() for s, _ in chats])
    if trained:
        print(f"WARNING: {len(trained)} of the {len(chats)} chats are not held out from the sidecar adapter's training "
              f"data: {describe(trained)}", file=sys.stderr)
    return trained


def cmd_bench_vllm(args) -> None:
    settings = parse_settings(args.settings)
    concurrent = parse_settings(args.concurrent_settings) if args.concurrent_settings else settings
    args.dataset = args.dataset or ["apibank:1"]
    out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-vllm")
    out.mkdir(parents=True, exist_ok=True)
    trained = trained_chats(args) if "oospec-sidecar" in settings + concurrent else []  # before any run starts
    runs = {}
    for conc in sorted({1, args.concurrency}):
        reference = None
        for setting in settings if conc == 1 else concurrent:
            path = run_setting(setting, conc, args, out, reference)
            if setting == "none":
                reference = path
            runs[(setting, conc)] = json.loads(path.read_text())
    summary = summarize(runs)
    if trained:
        (out / "trained_items.json").write_text(json.dumps(trained, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, out / "summary.png")
    print(json.dumps(summary, indent=1))
    print(f"written to {out}/summary.json and summary.png", file=sys.stderr)


def add_vllm_bench_parser(bench):
    """`oospec bench vllm`'s parser (the CLI adds the options every command shares)."""
    p = bench.add_parser("vllm", help="oospec's proposer inside vLLM vs vLLM's own speculation (run from .venv-vllm)")
    p.add_argument("--model", required=True, help="a Hugging Face folder (`oospec models pull` gives one)")
    p.add_argument("--dataset", action="append", help="repeatable, name:split (default apibank:1)")
    p.add_argument("--limit", type=int, default=20, help="chats per dataset")
    p.add_argument("--offset", type=int, default=0,
                   help="skip the first N chats of each dataset (8: API-Bank's items used in development)")
    p.add_argument("--settings", default=DEFAULT_SETTINGS, help=f"comma list of {', '.join(SETTINGS)}")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    p.add_argument("--concurrency", type=int, default=8, help="the concurrent runs' requests in flight")
    p.add_argument("--concurrent-settings", default=None, metavar="A,B",
                   help="the settings run at --concurrency (default: --settings); none always runs")
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile: quicker start, slower steps")
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-vllm)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the output folder's runs made with the same settings (an interrupted bench goes on)")
    p.set_defaults(func=cmd_bench_vllm)
    return p
