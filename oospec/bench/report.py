"""The results of `oospec bench run`: per-method summaries, the markdown report, summary.json and the PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from oospec.bench.hf_peers import PROMPT_LOOKUP_NUM_TOKENS
from oospec.bench.methods import ALL_CORES, AR_BASELINES, ORACLE, REFERENCE, TARGET_THREADS, uses_sidecar
from oospec.errors import optional_import

# The fields of summary.json, per dataset and method (the rest of a summary row is for the report only).
PUBLIC_FIELDS = ("n", "cores", "cpu_threads", "baseline", "tau", "decode_speedup", "e2e_speedup", "e2e_ratio_mean",
                 "decode_speedup_target_threads", "e2e_speedup_target_threads", "oracle_fraction", "oracle_share",
                 "identical_rate", "accuracy")


def _safe_div(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarize_sidecar(records: Sequence[dict]) -> dict:
    """{dataset: {method: sidecar stats}} for methods that ran with a sidecar."""
    out: dict[str, dict[str, dict]] = {}
    for r in records:
        sc = r.get("sidecar")
        if not sc:
            continue
        out.setdefault(r["dataset"], {}).setdefault(r["method"], []).append(sc)
    table: dict[str, dict[str, dict]] = {}
    for ds, per_method in out.items():
        for m, scs in per_method.items():
            answered = [x for x in scs if x.get("function") or x.get("no_call")]
            in_time = [x for x in answered if x.get("arrived")]
            agree = [x for x in answered if "function_match" in x]
            slots_total = sum(x.get("slots_total", 0) for x in agree)
            table.setdefault(ds, {})[m] = {
                "n": len(scs),
                "sent": float(np.mean([bool(x.get("submitted")) for x in scs])),  # the cost model ran the job
                "answered": len(answered) / len(scs),
                "in_time": len(in_time) / len(scs),
                "latency_s": float(np.mean([x["latency_s"] for x in answered if x.get("latency_s")])) if answered else None,
                "tokens_written_at_arrival": float(np.mean([x["tokens_written_at_arrival"] for x in in_time]))
                if in_time else None,
                "function_agreement": float(np.mean([x["function_match"] for x in agree])) if agree else None,
                "function_in_payload": float(np.mean([x.get("function_in_payload", x["function_match"])
                                                      for x in agree])) if agree else None,
                "slot_agreement": sum(x.get("slots_matched", 0) for x in agree) / slots_total if slots_total else None,
                "full_call_agreement": float(np.mean([x["full_match"] for x in agree])) if agree else None,
                "payload_bytes": float(np.mean([x["payload_bytes"] for x in answered])) if answered else None,
                "faults": sorted({x["fault"] for x in scs if x.get("fault")}),
                "followups": sum(1 for x in scs if x.get("followup", {}).get("submitted")),
                "followups_arrived": sum(1 for x in scs if x.get("followup", {}).get("arrived")),
            }
    return table


def summarize_turns(records: Sequence[dict]) -> dict:
    """{dataset: {turn: {method: {"n", "prefill_s", "e2e_s"}}}} of a session run (records with a `turn`): where
    the time goes as a session's prompt grows and its prefix is reused."""
    out: dict[str, dict[int, dict[str, dict]]] = {}
    for r in records:
        if r.get("turn") is None:
            continue
        cell = out.setdefault(r["dataset"], {}).setdefault(r["turn"], {}).setdefault(
            r["method"], {"n": 0, "prefill_s": 0.0, "e2e_s": 0.0})
        cell["n"] += 1
        cell["prefill_s"] += r["prefill_s"]
        cell["e2e_s"] += r["e2e_s"]
    return {ds: dict(sorted(turns.items())) for ds, turns in out.items()}


def format_turn_table(turns: dict[int, dict[str, dict]]) -> str:
    """One row per turn of the sessions: each method's summed end-to-end seconds (prefill seconds in brackets)."""
    methods = list(dict.fromkeys(m for cells in turns.values() for m in cells))
    lines = ["| turn | sessions | " + " | ".join(f"{m} e2e s (prefill)" for m in methods) + " |",
             "|" + "---|" * (2 + len(methods))]
    for turn, cells in turns.items():
        n = max(c["n"] for c in cells.values())
        lines.append(f"| {turn} | {n} | " + " | ".join(
            f"{cells[m]['e2e_s']:.1f} ({cells[m]['prefill_s']:.1f})" if m in cells else "–" for m in methods) + " |")
    return "\n".join(lines)


def format_sidecar_table(rows: dict[str, dict]) -> str:
    lines = ["| method | n | jobs sent | answered | in time | latency | tokens written at arrival "
             "| function agreement (best, any branch) | slot agreement | full-call agreement | payload bytes "
             "| follow-ups (arrived) | faults |",
             "|" + "---|" * 13]
    for m, r in rows.items():
        lines.append(f"| {m} | {r['n']} | {_pct(r.get('sent'))} | {_pct(r['answered'])} | {_pct(r['in_time'])} "
                     f"| {_fmt(r['latency_s'], '.1f', ' s')} | {_fmt(r['tokens_written_at_arrival'], '.1f')} "
                     f"| {_pct(r['function_agreement'])}, {_pct(r.get('function_in_payload'))} "
                     f"| {_pct(r['slot_agreement'])} "
                     f"| {_pct(r['full_call_agreement'])} | {_fmt(r['payload_bytes'], '.0f')} "
                     f"| {r.get('followups', 0)} ({r.get('followups_arrived', 0)}) "
                     f"| {', '.join(r['faults']) or 'none'} |")
    return "\n".join(lines)


def _baselines(per_method: dict[str, list[dict]]) -> dict[int, tuple[str, dict[str, dict]]]:
    """{cpu threads: (method, {sample id: record})} of the `ar` runs, `ar` itself first among equals."""
    out: dict[int, tuple[str, dict[str, dict]]] = {}
    for m in AR_BASELINES:
        recs = per_method.get(m, [])
        if recs:
            out.setdefault(recs[0].get("cpu_threads", 0), (m, {r["sample_id"]: r for r in recs}))
    return out


def _speedups(recs: list[dict], base: dict[str, dict]) -> tuple[float | None, float | None, float | None]:
    """(decode, e2e, mean e2e ratio) of `recs` against the baseline records of the same samples."""
    pairs = [(base[r["sample_id"]], r) for r in recs if r["sample_id"] in base]
    if not pairs:
        return None, None, None
    ratios = [x["e2e_s"] / r["e2e_s"] for x, r in pairs if r["e2e_s"] > 0]
    return (_safe_div(sum(x["decode_s"] for x, _ in pairs), sum(r["decode_s"] for _, r in pairs)),
            _safe_div(sum(x["e2e_s"] for x, _ in pairs), sum(r["e2e_s"] for _, r in pairs)),
            float(np.mean(ratios)) if ratios else None)


def summarize(records: Sequence[dict], methods: Sequence[str], target_threads: int | None = None) -> dict:
    """{dataset: {method: stats}}; speed-ups are ratios of summed times over the same samples, against `ar` on as
    many CPU threads as the method used (equal cores; `baseline` names that run), and, secondary, against `ar`
    with `target_threads` (the target's share of the cores when a sidecar runs beside it)."""
    by_ds: dict[str, dict[str, list[dict]]] = {}
    for r in records:
        by_ds.setdefault(r["dataset"], {}).setdefault(r["method"], []).append(r)
    summary: dict[str, dict[str, dict]] = {}
    for ds, per_method in by_ds.items():
        ref = {r["sample_id"]: r for r in per_method.get(REFERENCE, [])}
        baselines = _baselines(per_method)
        ref_threads = per_method[REFERENCE][0].get("cpu_threads", 0) if ref else 0
        secondary = baselines.get(target_threads if target_threads is not None else ref_threads)
        rows: dict[str, dict] = {}
        for m in methods:
            recs = [r for r in per_method.get(m, []) if r["sample_id"] in ref]
            if not recs:
                continue
            base_name, base = baselines.get(recs[0].get("cpu_threads", 0), (REFERENCE, ref))
            decode, e2e, ratio = _speedups(recs, base)
            decode_t, e2e_t, _ = _speedups(recs, secondary[1]) if secondary else (None, None, None)
            tok = sum(r["new_tokens"] for r in recs)
            fwd = sum(r["target_forwards"] for r in recs)
            scored = [r["accurate"] for r in recs if r["accurate"] is not None]
            rows[m] = {
                "n": len(recs),
                "cores": recs[0].get("cores"),
                "cpu_threads": recs[0].get("cpu_threads"),
                "baseline": base_name,
                "tau": _safe_div(tok, fwd),
                "decode_speedup": decode,
                "e2e_speedup": e2e,
                "e2e_ratio_mean": ratio,
                "decode_speedup_target_threads": decode_t,
                "e2e_speedup_target_threads": e2e_t,
                "oracle_fraction": None,
                "oracle_share": None,
                "identical_rate": float(np.mean([bool(r["identical"]) for r in recs])),
                "accuracy": float(np.mean(scored)) if scored else None,
                "new_tokens": tok,
                "target_forwards": fwd,
                "prefill_s": sum(r["prefill_s"] for r in recs),
                "decode_s": sum(r["decode_s"] for r in recs),
                "e2e_s": sum(r["e2e_s"] for r in recs),
            }
        oracle = rows.get(ORACLE, {}).get("decode_speedup")
        for row in rows.values():
            s = row["decode_speedup"]
            if oracle is not None and s is not None and oracle > 1:
                row["oracle_fraction"] = (s - 1) / (oracle - 1)
                row["oracle_share"] = s / oracle
        summary[ds] = rows
    return summary


def public_summary(summary: dict, sidecar: dict) -> dict:
    """summary.json: {dataset: {method: PUBLIC_FIELDS, and the sidecar's stats for sidecar methods}}."""
    public = {ds: {m: {k: r[k] for k in PUBLIC_FIELDS} for m, r in rows.items()} for ds, rows in summary.items()}
    for ds, rows in sidecar.items():
        for m, r in rows.items():
            public[ds][m]["sidecar"] = r
    return public


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def format_table(rows: dict[str, dict]) -> str:
    """One row per method; the target-threads column only when some method's baseline is not ar at those."""
    secondary = any(r.get("decode_speedup_target_threads") != r["decode_speedup"] for r in rows.values())
    head = ("| method | cores | n | tau | decode speed-up | e2e speed-up | mean e2e ratio | of oracle's speed-up "
            "| oracle fraction | identical | accuracy | prefill s | decode s | e2e s |")
    if secondary:
        head += " decode speed-up vs ar at target threads |"
    lines = [head, "|" + "---|" * (15 if secondary else 14)]
    for m, r in rows.items():
        line = (f"| {m} | {r.get('cores') or '–'} | {r['n']} | {_fmt(r['tau'])} "
                f"| {_fmt(r['decode_speedup'], suffix='x')} | {_fmt(r['e2e_speedup'], suffix='x')} "
                f"| {_fmt(r['e2e_ratio_mean'], suffix='x')} | {_pct(r.get('oracle_share'))} "
                f"| {_pct(r['oracle_fraction'])} | {_pct(r['identical_rate'])} | {_pct(r['accuracy'])} "
                f"| {_fmt(r.get('prefill_s'), '.1f')} | {_fmt(r.get('decode_s'), '.1f')} | {_fmt(r.get('e2e_s'), '.1f')} |")
        if secondary:
            line += f" {_fmt(r.get('decode_speedup_target_threads'), suffix='x')} |"
        lines.append(line)
    return "\n".join(lines)


# The report's footnotes: (the methods a note is about, None for every run; the note). A note is printed only
# when one of its methods ran, so the report explains what is in it and nothing else. ANY_SIDECAR stands for
# every method that runs a sidecar (they share the sidecar table).
ANY_SIDECAR = "(any sidecar method)"
NOTES: tuple[tuple[frozenset[str] | None, str], ...] = (
    (None, """\
- tau: new tokens / target forwards, summed over samples (prefill counted as one forward; 1.00 for ar)."""),
    (frozenset({"hf-pld", "hf-assisted"}), """\
  For hf-* the target forwards are counted with a forward hook on the target model (the assistant's own
  forwards are not counted)."""),
    (None, """\
- decode speed-up: sum of ar's decode times / sum of the method's, over the same samples (decode = after
  the prefill forward), where ar ran on as many CPU cores as the method used (equal cores: a 1+1 sidecar
  method against ar with 2 threads). e2e speed-up: the same with end-to-end times of the generate call
  (prompt already tokenized). mean e2e ratio: mean over samples of ar e2e / method e2e."""),
    (frozenset({TARGET_THREADS}), """\
- decode speed-up vs ar at target threads (when a sidecar runs on the CPU): against ar with the target's
  share of the cores only (ar-target-threads), as if the sidecar's cores were free."""),
    (frozenset({"hf-pld", "hf-assisted"}), """\
- hf-* peers are timed end to end only; their decode time is their e2e time minus the prefill time that
  our `ar` measured on the same sample."""),
    (None, """\
- of oracle's speed-up: decode speed-up / oracle's decode speed-up. oracle fraction: the stricter share
  of the gain, (speed-up - 1) / (oracle speed-up - 1); 100% = as fast as the oracle, 0% = no faster than
  ar (both empty when the oracle did not run). The oracle drafts ar's own tokens as one chain of `budget`
  tokens."""),
    (None, """\
- identical: generated token ids equal to ar's. accuracy: the benchmark's call check on the decoded text.
- cores: the target's torch threads, plus the sidecar's for methods that run one (it has its own process).
  Every method gets the same total: a sidecar method splits it, every other method (toolspec, hf-* and
  ar included) gives it all to the target (run.json `cores`)."""),
    (frozenset({"oospec-always"}), """\
  oospec-always: oospec that sends every request's job to the sidecar; oospec sends it only where the cost
  model expects the hints to save more than the job costs the target on shared cores (samples.jsonl
  sidecar.schedule)."""),
    (frozenset({"oospec-wait"}), """\
  oospec-wait: oospec whose target waits (up to 120 s, counted in its decode time) for the payload before
  its first draft: the tau of hints that are always in time, as a sidecar on its own accelerator gives a
  target that outpaces the CPU sidecar here."""),
    (frozenset({"oospec-own-cores"}), """\
  oospec-own-cores: oospec whose target keeps its own share of the cores even once the sidecar is idle
  (oospec borrows the idle sidecar's threads: samples.jsonl threads_borrowed)."""),
    (frozenset({ALL_CORES}), """\
  ar-all-cores: ar with every core, for reference."""),
    (frozenset({ANY_SIDECAR}), """\
- sidecar table: jobs sent = requests whose job the cost model ran; answered = a valid payload came back (perhaps after the request ended); in time = it
  arrived while the target was still decoding, so its hints could be used; tokens written at arrival (of
  those in time): 1.0 = before the first decode step (the sidecar ran during the prefill);
  latency = from the request's start to the payload; agreement = payload vs the call the target wrote
  (function: the best guess, and the best or an alternative branch; slots and full call: the guess for the
  target's function, exact JSON equality, full call = every slot right and no extra slot), for the first
  payload; follow-ups = requests where the target named a function no guess had, so the sidecar was asked
  for that function's slots (arrived: before the request ended)."""),
)


def footnotes(methods: Sequence[str]) -> str:
    """The notes about what ran: the general ones and those of the methods in `methods`."""
    ran = set(methods) | ({ANY_SIDECAR} if any(uses_sidecar(m) for m in methods) else set())
    return "\n".join(text for about, text in NOTES if about is None or about & ran)


# Below this many items per method a speed-up says little: one long prompt or one lucky draft moves it.
FEW_ITEMS = 5


def plural(n: int, word: str) -> str:
    """'1 thread', '2 threads'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def small_sample_warning(summary: dict) -> str | None:
    """One line when some dataset ran fewer than FEW_ITEMS items, else None."""
    small = {ds: max(r["n"] for r in rows.values()) for ds, rows in summary.items() if rows}
    small = {ds: n for ds, n in small.items() if n < FEW_ITEMS}
    if not small:
        return None
    which = ", ".join(f"{ds}: {plural(n, 'item')}" for ds, n in small.items())
    return (f"WARNING: few items ({which}); speed-ups from fewer than {FEW_ITEMS} items vary a lot from run to "
            f"run: use --limit {FEW_ITEMS * 2} or more for figures worth quoting")


def format_short_table(rows: dict[str, dict]) -> str:
    """The few columns a reader of the terminal wants, one row per method that ran."""
    lines = [f"{'method':20} {'cores':>5} {'n':>3} {'tau':>5} {'decode':>7} {'e2e':>7} {'identical':>9}"]
    for m, r in rows.items():
        lines.append(f"{m:20} {r.get('cores') or '–':>5} {r['n']:>3} {_fmt(r['tau']):>5} "
                     f"{_fmt(r['decode_speedup'], suffix='x'):>7} {_fmt(r['e2e_speedup'], suffix='x'):>7} "
                     f"{_pct(r['identical_rate']):>9}")
    return "\n".join(lines)


def format_stdout(summary: dict, out: Path) -> str:
    """What `bench run` prints when it is done: a short table per dataset, the sample-size warning, the files."""
    parts = []
    for ds, rows in summary.items():
        parts += [f"{ds} (speed-ups vs ar on equal cores)", format_short_table(rows), ""]
    warning = small_sample_warning(summary)
    if warning:
        parts += [warning, ""]
    parts.append(f"report: {out / 'report.md'} (every column, footnotes); plot: {out / 'speedup.png'}; "
                 f"per item: {out / 'samples.jsonl'}")
    return "\n".join(parts)


def format_report(summary: dict, header: dict, divergences: Sequence[dict], sidecar: dict | None = None,
                  turns: dict | None = None) -> str:
    lines = ["# oospec bench run", ""]
    lines.append(f"- command: `{header['command']}`")
    mi = header["machine"]
    lines.append(f"- machine: {mi['cpu']}, {mi['cores']} cores, torch threads {mi['torch_threads']}"
                 + (f", GPU {mi['gpu']}" if mi.get("gpu") else ""))
    lines.append(f"- target: {header['target']} ({header['dtype']}, {header['device']}, "
                 f"kernels: {header['kernels']})")
    if header.get("assistant"):
        lines.append(f"- hf-assisted assistant: {header['assistant']}")
    if header.get("sidecar"):
        sc = header["sidecar"]
        adapter = f" + {sc['adapter']} (weights sha256 {str(sc.get('adapter_sha256'))[:12]})" if sc.get("adapter") else ""
        lines.append(f"- sidecar: {sc['model']}{adapter} on {sc['device']} ({sc.get('dtype', 'auto')}), "
                     f"{plural(sc['threads'], 'thread')}, own process; target threads {header['target_threads']}")
    cores = header.get("cores")
    if cores:
        lines.append(f"- cores: {cores['total']} per method (sidecar methods: {cores['target_threads_with_sidecar']} "
                     f"target + {cores['sidecar_threads']} sidecar); machine {cores['machine_cores']}")
    if header.get("trained_items"):
        lines.append(f"- **WARNING: {len(header['trained_items'])} item(s) the sidecar adapter was trained on "
                     f"(run with --allow-trained-items); see run.json `trained_items`**")
    if header.get("mode"):
        lines.append(f"- mode: {header['mode']}")
    if "leftover" in header:  # runs' leftover work, waited out between runs: none reached another method's clock
        left = header["leftover"]
        lines.append("- work left running after a run's clock stopped, waited out before the next run: "
                     + ("; ".join(f"{m} {plural(v['runs'], 'run')}, {v['seconds']:.1f} s" for m, v in left.items())
                        if left else "none"))
    lines.append(f"- max_new_tokens {header['max_new_tokens']}, budget {header['budget']}, "
                 f"hf-pld prompt_lookup_num_tokens {PROMPT_LOOKUP_NUM_TOKENS}")
    decoding = header.get("decoding") or {"mode": "greedy"}
    if decoding["mode"] == "sampling":
        lines.append(f"- decoding: sampling, temperature {decoding['temperature']:g}, top_p {decoding['top_p']:g}, "
                     f"top_k {decoding['top_k']}, seed {decoding['seed']}; identical = {decoding['identical']}")
    lines.append(f"- software: torch {mi['torch']}, transformers {mi['transformers']}, python {mi['python']}")
    lines.append(f"- started {header['started']}, took {header.get('elapsed_s', 0):.0f} s")
    for ds, rows in summary.items():
        lines += ["", f"## {ds}", "", format_table(rows)]
        if turns and turns.get(ds):
            lines += ["", "By turn (agent sessions, prefix reuse per method):", "", format_turn_table(turns[ds])]
        if sidecar and sidecar.get(ds):
            lines += ["", "Sidecar:", "", format_sidecar_table(sidecar[ds])]
    warning = small_sample_warning(summary)
    if warning:
        lines += ["", f"**{warning}**"]
    lines += ["", footnotes([m for rows in summary.values() for m in rows])]
    if divergences:
        lines += ["", "## Outputs not identical to ar", "",
                  "| dataset | sample | method | first differing position | ar token | method token |",
                  "|---|---|---|---|---|---|"]
        for d in divergences:
            lines.append(f"| {d['dataset']} | {d['sample_id']} | {d['method']} | {d['first_diff']} "
                         f"| {d['ar_token']} | {d['method_token']} |")
    return "\n".join(lines) + "\n"


# The PNG's panels: (summary field, panel title). End to end is what a user waits for; decode is where drafting acts.
PANELS = (("decode_speedup", "decode speed-up vs ar"), ("e2e_speedup", "end-to-end speed-up vs ar"))


def _cores_label(cores: str | None) -> str:
    """'1 core', '2 cores', '1+1 cores' (target + sidecar threads), '1+cuda:1' (a sidecar on a device)."""
    if not cores:
        return "cores unknown"
    if cores.isdigit():
        return plural(int(cores), "core")
    return f"{cores} cores" if all(part.isdigit() for part in cores.split("+")) else cores


def plot_speedup(summary: dict, methods: Sequence[str], path: Path, title: str | None = None) -> None:
    """Two panels, decode and end-to-end speed-up against ar on equal cores, one bar group per dataset
    (its item count under its name), one bar per method (its cores in the legend). Needs the `plot` extra."""
    matplotlib = optional_import("matplotlib", "plot")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    shown = [m for m in methods if m != REFERENCE and any(m in rows for rows in summary.values())]
    datasets = list(summary)
    width = 0.8 / max(1, len(shown))
    x = np.arange(len(datasets))
    ticks = [f"{ds}\nn={max((r['n'] for r in summary[ds].values()), default=0)}" for ds in datasets]
    cores = {m: next((rows[m].get("cores") for rows in summary.values() if m in rows), None) for m in shown}
    panel_w = max(4.5, 1.4 * len(datasets) * max(1, len(shown)) ** 0.5 + 1.5)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(panel_w * len(PANELS), 4.2), squeeze=False)
    for ax, (field, name) in zip(axes[0], PANELS):
        values = {m: [summary[ds].get(m, {}).get(field) or 0.0 for ds in datasets] for m in shown}
        for i, m in enumerate(shown):
            bars = ax.bar(x - 0.4 + width * (i + 0.5), values[m], width, label=f"{m} ({_cores_label(cores[m])})")
            for b, v in zip(bars, values[m]):
                if v:
                    ax.annotate(f"{v:.2f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        top = max([1.0] + [v for vals in values.values() for v in vals])
        ax.set_ylim(0, top * 1.35)  # room for the labels and the legend
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_title(name + " (equal cores)", fontsize=9)
        ax.set_xticks(x, ticks)
        ax.set_ylabel(name)
        ax.legend(fontsize=7, ncol=min(3, max(1, len(shown))), loc="upper left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
