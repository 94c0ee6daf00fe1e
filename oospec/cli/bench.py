"""`oospec bench cost-curve | run | serve | vllm | llamacpp | project`: the parsers and what they call in
oospec.bench; the options they share (the model, the items, the sidecar...) come from oospec.cli.options."""

from __future__ import annotations

import sys

from oospec.bench import llamacpp  # stdlib only at import: cheap at parse time
from oospec.bench.config import BenchConfig
from oospec.bench.projection import FORWARDS, ProjectionConfig  # stdlib only: cheap at parse time
from oospec.bench.vllm_run import CUSTOM, DEFAULT_SETTINGS, SETTINGS  # imports no vLLM (torch, through the datasets)
from oospec.cli.options import (add_budget_option, add_command, add_item_options, add_max_new_tokens_option,
                                add_runtime_options, add_sampling_options, add_sidecar_options, add_threads_option,
                                default_of, item_selection, non_negative_int, positive_int, set_threads,
                                sidecar_settings)
from oospec.models.registry import DEFAULT_PREFIX_CACHE_MB, DEFAULT_TARGET

COST_CURVE_EXAMPLE = "oospec bench cost-curve --model smollm2-135m --ks 1,4,16 --out curve.json"
RUN_EXAMPLE = """oospec bench run --dataset apibank:1 --limit 8 --methods ar,toolspec,oospec
oospec bench run --model smollm2-135m --dataset bfcl:simple_python --limit 5 --methods ar,pld"""
SERVE_EXAMPLE = "oospec bench serve --model smollm2-135m --dataset apibank:1 --turns 4 --methods ar,toolspec"
VLLM_EXAMPLE = """VLLM_CPU_KVCACHE_SPACE=4 .venv-vllm/bin/oospec bench vllm --model ~/.cache/oospec/models/qwen2.5-coder-1.5b \\
    --dataset apibank:1 --offset 8 --limit 20 --settings none,oospec,oracle --enforce-eager"""
LLAMACPP_EXAMPLE = """oospec bench llamacpp --dataset apibank:1 --offset 8 --limit 20 --threads 2 \\
    --draft ~/.cache/oospec/gguf/qwen2.5-coder-0.5b.gguf
oospec bench llamacpp --model smollm2-135m --dataset bfcl:simple_python --limit 2 --modes ar,ngram --threads 1"""
PROJECT_EXAMPLE = """oospec bench project experiments/results/cold-apibank-bf16-v12 \\
    experiments/results/cold-bfcl-bf16-v10 --costs experiments/results/gpu-h200/gpu_check.json \\
    --shape qwen2.5-1.5b --out runs/projection"""


def cmd_bench_cost_curve(args) -> None:
    import torch

    from oospec.bench import cost_curve

    set_threads(args.threads)
    ks = tuple(int(k) for k in args.ks.split(","))
    if args.random_init:
        from oospec.models.cpu_features import auto_dtype

        name = auto_dtype(args.device) if args.dtype == "auto" else args.dtype
        dtype = getattr(torch, name)
        from oospec.models.random_init import random_model

        model = random_model(args.random_init, dtype, args.device)
        model.config._name_or_path = f"random:{args.random_init}"
        from oospec.engine.precision import prepare

        prepare(model, not args.no_optimize)  # the target's kernels (the invariant forward), as Engine uses them
    else:  # as Engine loads a target: a known model from its GGUF on a CPU, the kernels installed
        from oospec.engine.precision import load_target

        model, _, _ = load_target(args.model, dtype=args.dtype, device=args.device, optimize=not args.no_optimize)
        model.config._name_or_path = args.model
    with cost_curve.busy_processes(args.busy):
        result = cost_curve.measure(model, prompt_len=args.prompt_len, ks=ks, repeats=args.repeats)
    result["busy_processes"] = args.busy
    result["optimized"] = not args.no_optimize
    print(cost_curve.format_table(result))
    if args.out:
        cost_curve.write(result, args.out)
        print(f"written to {args.out}")


def bench_config(args) -> BenchConfig:
    """The BenchConfig the parsed `bench run` options ask for."""
    return BenchConfig(
        **item_selection(args), methods=args.methods.split(","), target=args.model, sessions=args.sessions,
        tool_choice=args.tool_choice, secondary_baseline=not args.no_secondary_baseline,
        max_new_tokens=args.max_new_tokens, budget=args.budget, threads=args.threads, out=args.out,
        assistant=args.assistant, dtype=args.dtype, device=args.device, optimize=not args.no_optimize,
        warmup=not args.no_warmup, progress=not args.no_progress,
        sidecar_model=args.sidecar_model, sidecar_threads=args.sidecar_threads, sidecar_device=args.sidecar_device,
        sidecar_dtype=args.sidecar_dtype, sidecar_adapter=args.sidecar_adapter, slot_adapter=args.slot_adapter,
        temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, seed=args.seed,
    )


def cmd_bench_run(args) -> None:
    from dataclasses import replace

    from oospec.bench.run import invoked_command, run_benchmark

    run_benchmark(replace(bench_config(args), command=invoked_command()))


def cmd_bench_serve(args) -> None:
    from oospec.bench import serve
    from oospec.bench.items import Selection

    selection = Selection(**item_selection(args))
    report = serve.run(args.model, [m.strip() for m in args.methods.split(",") if m.strip()], sidecar_settings(args),
                       selection, dialogue=args.dialogue, turns=args.turns, max_tokens=args.max_new_tokens,
                       prefix_cache_mb=args.prefix_cache_mb, threads=args.threads, dtype=args.dtype,
                       device=args.device, optimize=not args.no_optimize)
    out = serve.write(report, args.out, [*selection.datasets, *selection.data])
    print(serve.markdown(report))
    print(f"written to {out}/serve.md, serve.json and samples.jsonl", file=sys.stderr)


def cmd_bench_vllm(args) -> None:
    from oospec.bench.items import Selection

    selection = Selection(**item_selection(args))
    if args.setting:  # one setting in this process: what `bench vllm` starts once per setting
        from oospec.bench.vllm_run import run_one

        run_one(args, selection)
    else:
        from oospec.bench.vllm import run

        run(args, selection)


def cmd_bench_llamacpp(args) -> None:
    import torch

    from oospec.bench.items import Selection

    # The threads `bench run` gives `ar` by default (torch's: every physical core), so the two runs pair up.
    llamacpp.run(Selection(**item_selection(args)), gguf=args.gguf, model=args.model,
                 threads=args.threads or torch.get_num_threads(), max_new_tokens=args.max_new_tokens,
                 modes=args.modes, draft=args.draft, ctx_size=args.ctx_size, llamacpp_dir=args.llamacpp_dir,
                 bench_repeats=args.bench_repeats, out=args.out)


def cmd_bench_project(args) -> None:
    from oospec.bench import projection_report
    from oospec.bench.projection import project
    from oospec.bench.run import invoked_command

    cfg = ProjectionConfig(runs=args.runs, costs=args.costs, shape=args.shape, forward=args.forward,
                           sidecar_job_s=args.sidecar_job_s, tokenizer=args.tokenizer,
                           count_prompts=not args.no_prompt_count, host_time=not args.no_host_time, out=args.out)
    report = project(cfg, command=invoked_command())
    if args.check:
        report["check_source"] = args.check
        report["check"] = projection_report.check_measured(args.check)
    print(projection_report.markdown(report))
    if cfg.out:
        folder = projection_report.write(report, cfg.out)
        print(f"written to {folder}/projection.md and projection.json", file=sys.stderr)


def add_project_parser(bench) -> None:
    """`bench project`: CPU traces replayed against a GPU's measured costs (oospec/bench/projection.py)."""
    d = ProjectionConfig()
    p = add_command(bench, "project", "PROJECT tool-call benchmarks to a GPU: replay `bench run` traces against "
                                      "measured GPU costs (not a measurement)", PROJECT_EXAMPLE)
    p.add_argument("runs", nargs="+", metavar="RUN_FOLDER", help="`bench run` output folders")
    p.add_argument("--costs", default=d.costs, help="tests/gpu_check.py's gpu_check.json, tests/gpu_graph_check.py's "
                                                   "gpu_graph_check.json or a `bench cost-curve` JSON")
    p.add_argument("--shape", default=d.shape, help="the gpu_check preset whose costs price the runs' target")
    p.add_argument("--forward", default=d.forward, choices=FORWARDS,
                   help="whose costs price a step: padded/stock (gpu_check.json), eager/graph (gpu_graph_check.json)")
    p.add_argument("--sidecar-job-s", type=float, default=d.sidecar_job_s,
                   help="the sidecar's measured GPU job latency (default: the costs file's, else hints free)")
    p.add_argument("--tokenizer", default=d.tokenizer,
                   help="counts the prompt tokens that records lack (default: each run's target)")
    p.add_argument("--no-prompt-count", action="store_true", default=not d.count_prompts,
                   help="do not count missing prompt tokens (prefill then priced at the curve's prompt length)")
    p.add_argument("--no-host-time", action="store_true", default=not d.host_time,
                   help="leave out the recorded drafting time")
    p.add_argument("--check", metavar="GPU_CHECK_JSON", default=None,
                   help="also replay that file's own ar and oracle runs and compare with their measured times")
    p.add_argument("--out", default=d.out, help="folder for projection.md and projection.json")
    p.set_defaults(func=cmd_bench_project)


def add_vllm_parser(bench) -> None:
    """`bench vllm`: every option of the bench and of one setting's process, defined once (the process is started
    with this parser, see oospec/bench/vllm_run.py)."""
    p = add_command(bench, "vllm", "oospec's proposer inside vLLM vs vLLM's own speculation (run from .venv-vllm)",
                    VLLM_EXAMPLE)
    p.add_argument("--model", required=True, help="a Hugging Face folder (`oospec models pull` gives one)")
    add_item_options(p)
    p.add_argument("--settings", default=DEFAULT_SETTINGS,
                   help=f"comma list of {', '.join(SETTINGS)}; none (every speed-up's reference) always runs")
    p.add_argument("--concurrent-settings", default=None, metavar="A,B",
                   help="the settings run at --concurrency (default: --settings); none always runs")
    # float32: what the measured CPU rows (no native bfloat16 there) and the real-vLLM equivalence checks use.
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="vLLM's dtype")
    p.add_argument("--k", type=positive_int, default=8, help="num_speculative_tokens")
    p.add_argument("--concurrency", type=positive_int, default=8,
                   help="requests in flight at once: the concurrent runs' (every setting also runs one at a time), "
                        "or, with --setting, this run's")
    add_max_new_tokens_option(p, old_spelling="--max-tokens")
    p.add_argument("--max-model-len", type=positive_int, default=4096, help="vLLM's max_model_len")
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile: quicker start, slower steps")
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-vllm-<datasets>); with --setting, the "
                                 "run's JSON file")
    p.add_argument("--resume", action="store_true",
                   help="reuse the output folder's runs made with the same settings (an interrupted bench goes on)")
    one = p.add_argument_group("one setting in this process (what the bench starts for each; the real-vLLM tests)")
    one.add_argument("--setting", choices=[*SETTINGS, CUSTOM], default=None,
                     help="run only this setting and write --out as JSON (custom: the class --proposer names)")
    one.add_argument("--proposer", metavar="MODULE.CLASS", help="the proposer class of --setting custom")
    one.add_argument("--reference", metavar="FILE", help="the `none` setting's output JSON, for --setting oracle")
    p.set_defaults(func=cmd_bench_vllm)


def add_llamacpp_parser(bench) -> None:
    """`bench llamacpp`: llama.cpp's server on the items and prompt ids of `bench run` (oospec/bench/llamacpp.py)."""
    p = add_command(bench, "llamacpp", "llama.cpp as a peer: llama-server plain, with its n-gram speculation and "
                                       "with a draft model, on the prompt ids of `bench run`, and llama-bench",
                    LLAMACPP_EXAMPLE)
    p.add_argument("--model", "--target", dest="model", default=DEFAULT_TARGET, metavar="MODEL",
                   help="the model whose tokenizer and chat template build the prompt ids (as in `bench run`), and "
                        "whose GGUF runs unless --gguf")
    p.add_argument("--gguf", metavar="PATH", help="the target's GGUF (default: --model's own, the weights oospec "
                                                  "dequantizes)")
    add_item_options(p)
    add_threads_option(p, what="llama.cpp (-t and -tb, the draft model's too)",
                       default_text="torch's, what `bench run` gives ar")
    p.add_argument("--modes", metavar="A,B", help=f"comma list of {', '.join(llamacpp.SPECULATION)} (default: ar "
                                                  f"and ngram, and draft with --draft); ar always runs")
    p.add_argument("--draft", metavar="PATH", help="the draft mode's GGUF (the target's vocabulary)")
    add_max_new_tokens_option(p)
    p.add_argument("--ctx-size", type=positive_int, default=None,
                   help=f"llama-server's --ctx-size (default: the longest prompt + --max-new-tokens + "
                        f"{llamacpp.DRAFT_ROOM} for drafts)")
    p.add_argument("--bench-repeats", type=non_negative_int, default=default_of(llamacpp.run, "bench_repeats"),
                   help="llama-bench's -r (0: no llama-bench); its -p is the items' mean prompt length, its -n "
                        "--max-new-tokens")
    p.add_argument("--llamacpp-dir", metavar="DIR",
                   help=f"the folder of llama-server and llama-bench (default: ${llamacpp.DIR_ENV}, else "
                        f"$OOSPEC_HOME/llamacpp/build/bin, where {llamacpp.BUILD_SCRIPT} builds them)")
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-llamacpp-<datasets>)")
    p.set_defaults(func=cmd_bench_llamacpp)


def add_bench_parser(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_cmd", required=True,
                                                                      metavar="BENCH_COMMAND")
    p = add_command(bench, "cost-curve", "time one target forward verifying k tokens on a cached prompt",
                    COST_CURVE_EXAMPLE)
    p.add_argument("--random-init", metavar="ARCH",
                   help="random weights of a preset architecture (qwen2.5-7b, qwen2.5-1.5b, qwen2.5-0.5b) or a "
                        "config folder, instead of --model")
    p.add_argument("--prompt-len", type=positive_int, default=580)
    p.add_argument("--ks", default="1,2,4,8,16,32,64", help="comma list of draft sizes k")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="run N single-threaded busy loops beside the measurement (a laptop's other programs)")
    p.add_argument("--out", help="write the curve as JSON here")
    add_runtime_options(p)
    p.set_defaults(func=cmd_bench_cost_curve)

    p = add_command(bench, "run", "speed, identical-output rate and accuracy of decoding methods on benchmarks",
                    RUN_EXAMPLE)
    add_item_options(p)
    p.add_argument("--methods", default=",".join(BenchConfig().methods),
                   help="comma list: ar, pld, toolspec, oospec, ... (any drafter), oracle, ar-all-cores, hf-pld, "
                        "hf-assisted; ar always runs")
    p.add_argument("--assistant", default=BenchConfig.assistant, help="assistant model for hf-assisted")
    p.add_argument("--sessions", action="store_true",
                   help="agent sessions: each dialogue replayed turn by turn, every method reusing its own prefix "
                        "cache (target and sidecar) across a session's turns; --limit/--offset count sessions "
                        "(API-Bank level 1)")
    p.add_argument("--tool-choice", default=BenchConfig.tool_choice, choices=("auto", "required"),
                   help="required: every reply must call one of the item's tools, decoded under the call grammar "
                        "(llguidance), ar and every method alike")
    p.add_argument("--no-secondary-baseline", action="store_true",
                   help="skip ar at the target's share of the cores beside sidecar methods (the secondary column)")
    add_max_new_tokens_option(p, default=BenchConfig.max_new_tokens)
    add_budget_option(p, default=BenchConfig.budget)
    add_sampling_options(p, "0: greedy; > 0: every method samples, `ar` plainly, the others speculatively, with "
                            "the same seed per item", "the run's seed (items get their own from it)",
                         seed_default=BenchConfig.seed)
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-<datasets>)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation")
    p.add_argument("--slot-adapter", default=BenchConfig.slot_adapter, metavar="FOLDER",
                   help="the slot LoRA of oospec-rows: a peft adapter folder for the target, read by its slot rows "
                        "only (default: none, the target's own weights)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_runtime_options(p)
    add_sidecar_options(p)
    p.set_defaults(func=cmd_bench_run)

    p = add_command(bench, "serve", "replay a multi-turn dialogue (one of the sessions the item options select) "
                                    "against the server: per-turn latency with and without prefix reuse, ar vs a "
                                    "fast method", SERVE_EXAMPLE)
    add_item_options(p)
    p.add_argument("--methods", default="ar,toolspec,oospec",
                   help="comma list of drafters; each runs with prefix reuse off and on")
    p.add_argument("--dialogue", help="the dialogue (API-Bank: its file name) among the selected sessions "
                                      "(default: the one with the most turns)")
    p.add_argument("--turns", type=positive_int, default=None, help="replay only the first N turns (default: all)")
    add_max_new_tokens_option(p, old_spelling="--max-tokens")
    p.add_argument("--prefix-cache-mb", type=float, default=DEFAULT_PREFIX_CACHE_MB)
    p.add_argument("--out", help="output folder (default: runs/<timestamp>-serve-<datasets>)")
    add_runtime_options(p)
    add_sidecar_options(p, device_default=None)  # the sidecar shares the target's --device unless told
    p.set_defaults(func=cmd_bench_serve)

    add_vllm_parser(bench)
    add_llamacpp_parser(bench)
    add_project_parser(bench)
