"""`oospec bench vllm`: the same chats in vLLM with no speculation, vLLM's ngram, oospec's proposer (without
and with the sidecar) and the oracle proposer (the ceiling), one request at a time and `--concurrency` at once.

Each setting runs in its own process (vllm_run.py) on the same machine, one after another; speed-ups are
against vLLM without speculation at the same concurrency, in the same run. The chats are the items the item
options select (oospec.bench.items, as in `bench run`); with the oospec-sidecar setting, those the shipped
sidecar adapter was trained on are refused unless --allow-trained-items (or dropped with --held-out-only).
Written to the output folder (oospec.bench.records): `<setting>@<concurrency>.json` (ids, tokens and timings
per chat, the run's own file), `samples.jsonl` (one record per chat and method, compared with no speculation's
tokens), `summary.json` as
{dataset: {method: {n, tau, e2e_speedup, decode_speedup, oracle_fraction, identical_rate, diverged_at,
throughput_tok_s}}} (diverged_at: {chat id: index of its first output token unlike no speculation's}; method:
setting, plus `@8` for the concurrent runs; throughput is the whole run's, over all its datasets) and
`summary.png`. Run it from .venv-vllm.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from oospec.bench.items import BenchError, select
from oospec.bench.records import RecordLog, compared, first_difference, output_folder, write_json
from oospec.bench.vllm_run import SETTINGS, SIDECAR_SETTING, run_identity, sidecar_adapter
from oospec.errors import MissingExtraError, optional_import

# The options a setting's process is given as they were given here (one parser, oospec.cli.bench): the item
# selection and how vLLM runs. (attribute, flag); lists repeat the flag, booleans are flags.
PASSED_ON = (("model", "--model"), ("dataset", "--dataset"), ("split", "--split"), ("data", "--data"),
             ("items", "--items"), ("offset", "--offset"), ("limit", "--limit"), ("dtype", "--dtype"), ("k", "--k"),
             ("max_new_tokens", "--max-new-tokens"), ("max_model_len", "--max-model-len"),
             ("enforce_eager", "--enforce-eager"), ("allow_trained_items", "--allow-trained-items"))


def setting_command(setting: str, concurrency: int, args, path: Path, reference: Path | None,
                    held_out_only: bool) -> list[str]:
    """The command line of one setting's process: `oospec bench vllm --setting ...` with this run's options."""
    cmd = [sys.executable, "-m", "oospec", "bench", "vllm", "--setting", setting, "--concurrency", str(concurrency),
           "--out", str(path)]
    for name, flag in PASSED_ON:
        value = getattr(args, name, None)
        if value is None or value is False:
            continue
        if value is True:
            cmd.append(flag)
        else:
            for one in value if isinstance(value, list) else [value]:
                cmd += [flag, str(one)]
    if held_out_only:
        cmd.append("--held-out-only")
    if setting == "oracle":
        cmd += ["--reference", str(reference)]
    return cmd


def run_setting(setting: str, concurrency: int, args, out: Path, reference: Path | None,
                held_out_only: bool = False) -> Path:
    path = out / f"{setting}@{concurrency}.json"
    if args.resume and path.is_file():
        want = run_identity(SimpleNamespace(**{**vars(args), "setting": setting, "concurrency": concurrency,
                                               "held_out_only": held_out_only}))
        got = json.loads(path.read_text())
        if {k: got.get(k) for k in want} == want:
            print(f"[bench vllm] {setting} x{concurrency}: reusing {path}", file=sys.stderr, flush=True)
            return path
        print(f"[bench vllm] {setting} x{concurrency}: {path} was run otherwise; running again", file=sys.stderr)
    print(f"[bench vllm] {setting} x{concurrency}", file=sys.stderr, flush=True)
    subprocess.run(setting_command(setting, concurrency, args, path, reference, held_out_only), check=True)
    return path


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
            diverged = {k: first_difference(base["items"][k]["tokens"], run["items"][k]["tokens"]) for k in ids
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
    """Needs the `plot` extra."""
    matplotlib = optional_import("matplotlib", "plot")
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
        raise BenchError(f"unknown setting(s) {unknown}; choose from {', '.join(SETTINGS)}")
    return ["none"] + [s for s in dict.fromkeys(settings) if s != "none"]


def records(runs: dict[tuple[str, int], dict]):
    """samples.jsonl's records: one per chat and method, compared with no speculation's tokens at the same
    concurrency."""
    for (setting, conc), run in runs.items():
        base = runs[("none", conc)]["items"]
        for item_id, item in run["items"].items():
            yield {"dataset": item["dataset"], "sample_id": item_id, "method": setting if conc == 1 else
                   f"{setting}@{conc}", **{k: v for k, v in item.items() if k not in ("dataset", "prompt_ids")},
                   **compared(base[item_id]["tokens"], item["tokens"])}


def run(args, selection) -> Path:
    """Every setting in its own process, one at a time then --concurrency at once; the records and the summary
    written to the output folder, which is returned."""
    settings = parse_settings(args.settings)
    concurrent = parse_settings(args.concurrent_settings) if args.concurrent_settings else settings
    # The items are chosen and checked before any run starts, as every benchmark checks them when the sidecar
    # runs (its adapter's training items: refused, or dropped with --held-out-only, or run when allowed).
    with_sidecar = SIDECAR_SETTING in settings + concurrent
    _, trained = select(selection, sidecar_adapter() if with_sidecar else None)
    out = output_folder(args.out, [*selection.datasets, *selection.data], command="vllm")
    runs = {}
    for conc in sorted({1, args.concurrency}):
        reference = None
        for setting in settings if conc == 1 else concurrent:
            path = run_setting(setting, conc, args, out, reference,
                               held_out_only=with_sidecar and selection.held_out_only)
            if setting == "none":
                reference = path
            runs[(setting, conc)] = json.loads(path.read_text())
    summary = summarize(runs)
    with RecordLog(out) as log:
        for record in records(runs):
            log.write(record)
    if trained:
        write_json(out / "trained_items.json", trained)
    write_json(out / "summary.json", summary)
    try:
        plot(summary, out / "summary.png")
    except MissingExtraError as e:
        print(f"summary.png not written: {e}", file=sys.stderr)
    print(json.dumps(summary, indent=1))
    print(f"written to {out}/summary.json, summary.png and samples.jsonl", file=sys.stderr)
    return out
