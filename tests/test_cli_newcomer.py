"""What a newcomer meets first: one vocabulary and one set of defaults in every command, --help with defaults,
choices and examples, errors that point the right way (with "did you mean"), `oospec.load`, and `generate`'s
tool calls and sidecar report. SmolLM2-135M is the one real model here."""

import inspect
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from sidecar_fakes import InstantSidecar

from oospec.cli import build_parser, main
from oospec.models.registry import DEFAULT_BUDGET, DEFAULT_METHOD, DEFAULT_SIDECAR, DEFAULT_TARGET, TINY_TARGET
from oospec.sidecar.protocol import Guess

MODEL = TINY_TARGET
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
# Every command that runs a target: how it is called with no options at all.
TARGET_COMMANDS = [["generate", "--messages", "m.json"], ["demo"], ["serve"], ["bench", "run"], ["bench", "serve"],
                   ["bench", "cost-curve"]]
DECODING_COMMANDS = [["generate", "--messages", "m.json"], ["demo"], ["serve"]]  # one reply per request


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """generate and oospec.load set the target's threads for the process: give the next test its threads back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_cli(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parse_error(argv, capsys) -> str:
    """argparse's message for a bad command line (it exits with 2)."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def write(tmp_path, name, obj) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return str(path)


# -- one vocabulary, one set of defaults --------------------------------------------------------------------


def test_every_decoding_command_has_the_same_defaults():
    parser = build_parser()
    for argv in DECODING_COMMANDS:
        args = parser.parse_args(argv)
        assert (args.method, args.model, args.budget, args.threads) == (DEFAULT_METHOD, DEFAULT_TARGET,
                                                                        DEFAULT_BUDGET, None), argv
        assert (args.sidecar_model, args.sidecar_adapter, args.sidecar_threads) == (DEFAULT_SIDECAR, "auto", 1), argv
    assert parser.parse_args(["bench", "run"]).budget == DEFAULT_BUDGET


def test_the_library_defaults_are_the_commands_defaults():
    from oospec.bench.config import BenchConfig
    from oospec.engine.engine import Engine
    from oospec.pipeline import load
    from oospec.server.service import ServerConfig

    assert inspect.signature(Engine.__init__).parameters["budget"].default == DEFAULT_BUDGET
    assert BenchConfig().budget == DEFAULT_BUDGET and BenchConfig().target == DEFAULT_TARGET
    assert ServerConfig("m").method == DEFAULT_METHOD and ServerConfig("m").budget == DEFAULT_BUDGET
    defaults = inspect.signature(load).parameters
    assert (defaults["model"].default, defaults["method"].default, defaults["budget"].default) == (
        DEFAULT_TARGET, DEFAULT_METHOD, DEFAULT_BUDGET)


@pytest.mark.parametrize("argv", TARGET_COMMANDS, ids=" ".join)
def test_model_and_target_name_the_same_option(argv):
    parser = build_parser()
    assert parser.parse_args(argv + ["--model", "x"]).model == "x"
    assert parser.parse_args(argv + ["--target", "y"]).model == "y"


def test_serve_takes_the_model_as_vllm_does():
    parser = build_parser()
    assert parser.parse_args(["serve", "smollm2-135m"]).model == "smollm2-135m"
    assert parser.parse_args(["serve", "--port", "9000", "smollm2-135m", "--method", "pld"]).model == "smollm2-135m"
    assert parser.parse_args(["serve"]).model == DEFAULT_TARGET


def test_sidecar_options_have_the_same_names_everywhere():
    parser = build_parser()
    for argv in DECODING_COMMANDS + [["bench", "run"], ["bench", "serve"]]:
        for flag in ("--sidecar-model", "--sidecar"):
            args = parser.parse_args(argv + [flag, "s", "--sidecar-adapter", "none", "--sidecar-threads", "2",
                                             "--sidecar-device", "cuda:1"])
            assert (args.sidecar_model, args.sidecar_adapter, args.sidecar_threads, args.sidecar_device) == (
                "s", "none", 2, "cuda:1"), argv


class RecordedSidecar(InstantSidecar):
    """Stands in for SidecarClient: records how the sidecar process would have been started; loads nothing."""

    started = []

    def __init__(self, model, **options):
        super().__init__([Guess("get_weather", {"city": "Paris"})])
        self.model, self.closed = model, False
        RecordedSidecar.started.append((model, options))

    def close(self):
        self.closed = True


@pytest.fixture
def recorded_sidecar(monkeypatch):
    from oospec.sidecar import process

    RecordedSidecar.started = []
    monkeypatch.setattr(process, "SidecarClient", RecordedSidecar)
    return RecordedSidecar.started


def test_serve_drafts_as_oospec_with_the_shipped_sidecar_unless_told(recorded_sidecar):
    """`serve --method oospec` without --sidecar starts the shipped sidecar and adapter (it once drafted as
    toolspec, silently); a method without a sidecar starts none."""
    from oospec.cli.serve import make_server_drafter
    from oospec.sidecar import process

    drafter, sidecar = make_server_drafter(build_parser().parse_args(["serve", "--method", "oospec"]))
    [(model, options)] = recorded_sidecar
    shipped = process.ADAPTERS_DIR / process.SHIPPED_ADAPTERS[model]
    assert model == DEFAULT_SIDECAR and options["adapter"] == str(shipped)
    assert drafter.name == "oospec" and drafter.sidecar_drafter.sidecar is sidecar
    drafter, sidecar = make_server_drafter(build_parser().parse_args(["serve", "--method", "toolspec"]))
    assert sidecar is None and drafter.name == "toolspec" and len(recorded_sidecar) == 1
    drafter, _ = make_server_drafter(build_parser().parse_args(["serve", "--method", "oospec"]))
    assert drafter.sidecar_drafter.schedule == "cost"
    drafter, _ = make_server_drafter(build_parser().parse_args(["serve", "--sidecar-schedule", "always"]))
    assert drafter.sidecar_drafter.schedule == "always"  # the fuzz's memory cases need every job sent


def test_a_server_service_refuses_oospec_without_a_sidecar():
    from oospec.errors import OospecError
    from oospec.server.service import ModelService, ServerConfig

    with pytest.raises(OospecError, match="needs a sidecar"):
        ModelService(engine=None, config=ServerConfig("m", method="oospec"))


def test_the_target_gets_the_cores_the_sidecar_leaves():
    import torch

    from oospec.pipeline import target_threads
    from oospec.sidecar.process import SidecarSettings

    cores = torch.get_num_threads()
    assert target_threads(None, SidecarSettings()) == max(1, cores - 1)
    assert target_threads(None, SidecarSettings(threads=2)) == max(1, cores - 2)
    assert target_threads(3, SidecarSettings()) == 3  # as told
    assert target_threads(None, None) is None  # no sidecar: torch's default, all cores
    assert target_threads(None, SidecarSettings(device="cuda:1")) is None  # the sidecar takes no core


def test_one_rule_splits_the_cores_for_every_caller():
    """The bench's plan and oospec.load's threads come from one rule, and a method's drafter says whether it
    needs a sidecar at all."""
    from oospec.bench.config import BenchConfig, plan_cores
    from oospec.drafters import DRAFTERS, SIDECAR_DRAFTERS, uses_sidecar
    from oospec.engine.threads import split_cores

    assert split_cores(8, None, 2, "cpu") == (6, 2)
    assert split_cores(8, 3, 2, "cpu") == (3, 2)  # the target's threads as told
    assert split_cores(1, None, 1, "cpu") == (1, 1)  # never below one
    assert split_cores(8, None, 2, "cuda:1") == (8, 0) and split_cores(8, None, 2, None) == (8, 0)
    assert SIDECAR_DRAFTERS == {"sidecar", "oospec"} == {m for m in DRAFTERS if DRAFTERS[m].uses_sidecar}
    assert uses_sidecar("oospec") and not uses_sidecar("toolspec") and not uses_sidecar("no-such-method")
    cores = plan_cores(BenchConfig(sidecar_threads=2), 8, with_sidecar=True)
    assert (cores.target, cores.sidecar, cores.total) == (6, 2, 8)
    assert (plan_cores(BenchConfig(sidecar_threads=2), 8, with_sidecar=False).target, cores.sidecar_device) == (8, "cpu")


# -- --help ---------------------------------------------------------------------------------------------------


def help_text(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv + ["--help"])
    return capsys.readouterr().out


def test_help_shows_defaults_choices_and_an_example(capsys):
    from oospec.drafters import DRAFTERS
    from oospec.models.registry import KNOWN_MODELS

    for argv in DECODING_COMMANDS:
        text = " ".join(help_text(argv, capsys).split())  # unwrapped
        assert "example:" in text, argv
        assert f"(default: {DEFAULT_METHOD})" in text and f"(default: {DEFAULT_TARGET})" in text, argv
        assert f"(default: {DEFAULT_BUDGET})" in text and "(default: None)" not in text, argv
        assert all(method in text for method in DRAFTERS) and all(model in text for model in KNOWN_MODELS), argv
    text = " ".join(help_text(["bench", "run"], capsys).split())
    assert all(dataset in text for dataset in ("apibank", "bfcl", "toolalpaca")) and "example:" in text
    assert "{auto,float32,bfloat16,float16}" in text
    for argv in (["bench", "serve"], ["bench", "cost-curve"], ["bench", "llamacpp"], ["models", "pull"],
                 ["models", "list"], ["sidecar", "train"], ["sidecar", "eval"], ["sidecar", "traces"]):
        assert "example:" in help_text(argv, capsys), argv
    text = " ".join(help_text(["bench", "vllm"], capsys).split())
    assert "example:" in text and "(default: float32)" in text and "(default: 8)" in text and "(default: all)" in text


def test_verbose_goes_before_or_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["-v", "models", "list"]).verbose
    assert parser.parse_args(["models", "list", "--verbose"]).verbose
    assert not parser.parse_args(["models", "list"]).verbose


def test_quiet_unless_verbose(monkeypatch, capsys):
    """No weight-loading bars or library FutureWarnings by default; set in the environment, so that the sidecar's
    own process inherits it."""
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "PYTHONWARNINGS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["-v", "models", "list"]) == 0
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    assert main(["models", "list"]) == 0
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and "FutureWarning" in os.environ["PYTHONWARNINGS"]


# -- errors that point the right way --------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["bench", "run", "--dataset", "apibank", "--limit", "0"],
                                  ["generate", "--messages", "m.json", "--max-new-tokens", "0"],
                                  ["serve", "--budget", "0"], ["demo", "--threads", "-1"]], ids=" ".join)
def test_counts_must_be_at_least_one(argv, capsys):
    assert "must be >= 1" in parse_error(argv, capsys)


def test_a_mistyped_method_gets_a_suggestion(capsys):
    err = parse_error(["generate", "--messages", "m.json", "--method", "oospc"], capsys)
    assert "unknown method 'oospc' (did you mean 'oospec'?)" in err
    code, _, err = run_cli(["bench", "run", "--dataset", "apibank", "--methods", "ar,toolspc", "--limit", "1"], capsys)
    assert code == 2 and "did you mean 'toolspec'?" in err


def test_a_mistyped_dataset_gets_a_suggestion(capsys):
    code, _, err = run_cli(["bench", "run", "--dataset", "apibnk", "--limit", "1"], capsys)
    assert code == 2 and "unknown dataset 'apibnk' (did you mean 'apibank'?)" in err


def test_a_mistyped_model_gets_a_suggestion(tmp_path, capsys):
    messages = write(tmp_path, "m.json", CHAT)
    code, _, err = run_cli(["generate", "--model", "qwen2.5-coder-15b", "--messages", messages], capsys)
    assert code == 2 and "did you mean 'qwen2.5-coder-1.5b'?" in err


def test_models_pull_typo_suggests_the_name_not_a_folder(capsys):
    code, _, err = run_cli(["models", "pull", "smollm2-135"], capsys)
    assert code == 2 and "did you mean 'smollm2-135m'?" in err and "folder" not in err


@pytest.mark.parametrize("tools", [WEATHER, {"tools": "get_weather"}, ["get_weather"]], ids=str)
def test_a_tools_file_must_hold_a_list_of_tools(tools, tmp_path, capsys):
    """Refused before any model is loaded, with what the file should hold."""
    argv = ["generate", "--model", "no-such-model", "--messages", write(tmp_path, "m.json", CHAT),
            "--tools", write(tmp_path, "t.json", tools)]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "tools file must be a JSON list of tools" in err


def test_a_tools_file_may_be_a_request_body(tmp_path):
    from oospec.cli.options import load_tools

    assert load_tools(write(tmp_path, "t.json", {"tools": [WEATHER]})) == [WEATHER]
    assert load_tools(write(tmp_path, "t.json", [WEATHER])) == [WEATHER]


def test_a_template_that_drops_tools_is_an_error(smollm2_tokenizer):
    """SmolLM2's template renders the same prompt with and without tools: the model would never see them."""
    from oospec.errors import ChatTemplateError
    from oospec.pipeline import check_template_renders_tools

    with pytest.raises(ChatTemplateError, match="cannot render tools"):
        check_template_renders_tools(SimpleNamespace(tokenizer=smollm2_tokenizer), CHAT, [WEATHER])


def test_a_template_that_renders_tools_passes():
    """A Qwen2.5-style template (tools in the system prompt) is accepted."""
    from oospec.pipeline import check_template_renders_tools

    class Tokenizer:
        def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, tokenize=False):
            return ("<tools>" + json.dumps(tools) + "</tools>" if tools else "") + json.dumps(messages)

    check_template_renders_tools(SimpleNamespace(tokenizer=Tokenizer()), CHAT, [WEATHER])


def test_generate_refuses_tools_the_template_drops(smollm2_path, tmp_path, capsys):
    argv = ["generate", "--model", MODEL, "--method", "pld", "--messages", write(tmp_path, "m.json", CHAT),
            "--tools", write(tmp_path, "t.json", [WEATHER])]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "cannot render tools" in err and "Traceback" not in err


# -- generate's report and the Python path ---------------------------------------------------------------------


def test_generate_json_reports_tool_calls_and_the_sidecar(smollm2_path, tmp_path, capsys, recorded_sidecar):
    """Default method (oospec) with a scripted sidecar: the JSON carries the sidecar's report; the text output
    says what it predicted. SmolLM2 cannot render tools, so the tools here are in the prompt's prose."""
    messages = write(tmp_path, "m.json", CHAT)
    code, out, err = run_cli(["generate", "--model", MODEL, "--messages", messages, "--max-new-tokens", "8",
                              "--json"], capsys)
    assert code == 0, err
    reply = json.loads(out)
    assert reply["method"] == DEFAULT_METHOD and reply["tool_calls"] == [] and "sidecar" in reply
    assert recorded_sidecar and recorded_sidecar[0][0] == DEFAULT_SIDECAR
    code, out, err = run_cli(["generate", "--model", MODEL, "--method", "pld", "--messages", messages,
                              "--max-new-tokens", "8", "--json"], capsys)
    reply = json.loads(out)
    assert code == 0 and reply["sidecar"] is None and reply["new_tokens"] == 8


def test_sidecar_report_in_words():
    from oospec.drafters.sidecar import SidecarReport
    from oospec.pipeline import sidecar_lines

    report = SidecarReport(submitted=True, arrived=True, tokens_written_at_arrival=1, compute_s=0.4,
                           payload_bytes=80, function="get_weather", arguments={"city": "Paris"},
                           call_probability=0.97)
    text = "\n".join(sidecar_lines(report))
    assert "get_weather({'city': 'Paris'})" in text and "0.97" in text and "before the target's first decode" in text
    assert "no payload" in sidecar_lines(SidecarReport(submitted=True, fault="crashed"))[0]
    assert sidecar_lines(SidecarReport()) == []  # nothing was asked of the sidecar
    skipped = SidecarReport(schedule={"run": False, "why": "costs more than it saves", "new_tokens": 650,
                                      "job_s": 6.0, "cost_s": 3.0, "gain_s": 1.4})
    assert "not asked" in sidecar_lines(skipped)[0] and "~3.0 s of prefill" in sidecar_lines(skipped)[0]


def test_load_is_the_whole_python_path_and_lossless(smollm2_path, smollm2_engine, recorded_sidecar):
    """`oospec.load` starts the target, the drafter and the sidecar; greedy output is plain greedy's; closing
    the pipeline closes the sidecar. float32 like the reference engine: `--dtype auto` is bfloat16 on some CPUs
    (test_invariant.py covers that pick), and identity is promised per dtype."""
    import oospec

    reference = smollm2_engine.generate(CHAT, max_new_tokens=12)
    with oospec.load(MODEL, threads=1, dtype="float32") as pipe:
        result = pipe.generate(CHAT, max_new_tokens=12)
        assert isinstance(pipe.sidecar, RecordedSidecar) and pipe.drafter.name == DEFAULT_METHOD
    assert pipe.sidecar.closed and np.array_equal(result.tokens, reference.tokens)
    with oospec.load(MODEL, "pld", threads=1, dtype="float32") as pipe:
        assert pipe.sidecar is None and pipe.sidecar_report is None
        assert np.array_equal(pipe.generate(CHAT, max_new_tokens=12).tokens, reference.tokens)
        # The conversation resent (an agent's next turn): its prefix comes from the pipeline's prefix cache.
        again = pipe.generate(CHAT, max_new_tokens=12)
        assert again.stats.prompt_tokens_reused > 0 and np.array_equal(again.tokens, reference.tokens)
    assert len(recorded_sidecar) == 1


def test_demo_table_fits_80_columns():
    from rich.console import Console

    from oospec.demo import TABLE_COLUMNS, results_table

    stats = SimpleNamespace(new_tokens=128, target_forwards=40, tau=3.2, prefill_s=12.34, decode_s=10.5)
    results = {"ar": SimpleNamespace(stats=stats), "toolspec": SimpleNamespace(stats=stats)}
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(results_table(results, "ar vs toolspec: qwen2.5-coder-1.5b, 1234-token prompt (times in s)"))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert all(column in text for column in ("method", *TABLE_COLUMNS)) and "…" not in text


def test_argparse_errors_name_the_option(capsys):
    """argparse's own wording around our messages: the option is named."""
    err = parse_error(["bench", "run", "--limit", "zero"], capsys)
    assert "--limit" in err and "expected an integer >= 1" in err


def test_the_server_logs_one_line_per_request(smollm2_engine, caplog):
    """What ran for each request, in the server's log: method, prompt and new tokens, tau and the path taken."""
    import logging

    import openai

    from oospec.server.loopback import serving
    from oospec.server.service import ModelService, ServerConfig

    caplog.set_level(logging.INFO, logger="oospec.server")
    service = ModelService(smollm2_engine, ServerConfig(MODEL, method="pld", prefix_cache_mb=0))
    try:
        with serving(service) as url:
            client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    finally:
        service.close()
    [line] = [r.getMessage() for r in caplog.records if "/v1/chat/completions" in r.getMessage()]
    assert line.startswith("POST /v1/chat/completions 200 ")
    for field in ("method=pld", "prompt_tokens=", "new=4", "tau=", "path=pld", "finish=length"):
        assert field in line, (field, line)
