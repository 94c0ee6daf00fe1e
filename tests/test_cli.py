"""Bad input reaches the user as one clear line and exit code 2, never a traceback from inside torch."""

import json

import numpy as np
import pytest
from helpers import tiny_model

from oospec.cli import main
from oospec.drafters import make_drafter
from oospec.engine.engine import Engine, validate_messages
from oospec.errors import ContextLengthError, InvalidMessagesError


def run_cli(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_unknown_model_name(tmp_path, capsys):
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    code, _, err = run_cli(["generate", "--model", "no-such-model-xyz", "--messages", str(msgs)], capsys)
    assert code == 2
    assert "no-such-model-xyz" in err and "Traceback" not in err


def test_corrupt_weights(tmp_path, capsys):
    folder = tmp_path / "broken"
    tiny_model("qwen2").save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    code, _, err = run_cli(["generate", "--model", str(folder), "--messages", str(msgs)], capsys)
    assert code == 2
    assert "model.safetensors" in err or "corrupt" in err.lower() or "truncated" in err.lower()


def test_messages_file_not_json(tmp_path, capsys):
    msgs = tmp_path / "m.json"
    msgs.write_text("{not json")
    code, _, err = run_cli(["generate", "--model", "smollm2-135m", "--messages", str(msgs)], capsys)
    assert code == 2 and "not valid JSON" in err


@pytest.mark.parametrize(
    "messages",
    [
        [],
        {"role": "user", "content": "hi"},
        ["hello"],
        [{"role": "robot", "content": "hi"}],
        [{"role": "user"}],
        [{"role": "user", "content": 42}],
    ],
)
def test_invalid_messages(messages):
    with pytest.raises(InvalidMessagesError):
        validate_messages(messages)


class FakeTokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_prompt_longer_than_context():
    model = tiny_model("llama")
    engine = Engine(model, FakeTokenizer())
    too_long = np.arange(model.config.max_position_embeddings + 5) % 300
    with pytest.raises(ContextLengthError, match="context"):
        engine.generate(prompt_ids=too_long, max_new_tokens=4)


def test_max_new_tokens_capped_by_context():
    model = tiny_model("llama")
    engine = Engine(model, FakeTokenizer())
    prompt = np.arange(model.config.max_position_embeddings - 3) % 300
    out = engine.generate(prompt_ids=prompt, drafter=make_drafter("pld"), max_new_tokens=50)
    assert out.stats.new_tokens == 3


def test_cost_curve_on_random_weights(tmp_path, capsys):
    config_dir = tmp_path / "cfg"
    tiny_model("qwen2").config.save_pretrained(config_dir)
    out = tmp_path / "curve.json"
    code, stdout, _ = run_cli(["bench", "cost-curve", "--random-init", str(config_dir), "--ks", "1,2,4",
                               "--repeats", "1", "--prompt-len", "16", "--out", str(out)], capsys)
    assert code == 0 and "c(k)/c(1)" in stdout
    curve = json.loads(out.read_text())
    assert curve["ks"] == [1, 2, 4] and curve["ratio"]["1"] == 1.0 and curve["seconds"]["4"] > 0


def test_serve_runs_the_sidecar_with_the_shipped_adapter(monkeypatch):
    """`oospec serve --method oospec --sidecar qwen2.5-coder-0.5b` gives the sidecar the shipped LoRA adapter, as
    generate, demo and bench do (serve once started the base model: its --sidecar-adapter had no default)."""
    from oospec.cli import build_parser
    from oospec.cli.serve import make_server_drafter
    from oospec.sidecar import process

    started = []

    class FakeClient:  # records how the sidecar process would have been started; loads nothing
        def __init__(self, model, **options):
            started.append((model, options))

        def close(self):
            pass

    monkeypatch.setattr(process, "SidecarClient", FakeClient)
    args = build_parser().parse_args(["serve", "--method", "oospec", "--sidecar", "qwen2.5-coder-0.5b"])
    drafter, sidecar = make_server_drafter(args)
    [(model, options)] = started
    shipped = process.ADAPTERS_DIR / process.SHIPPED_ADAPTERS[model]
    assert (shipped / "adapter_config.json").is_file()
    assert options["adapter"] == str(shipped)
    assert isinstance(sidecar, FakeClient) and drafter is not None


def test_every_command_asks_for_the_same_default_sidecar():
    """One definition of the sidecar options: the same flags mean the same sidecar in every command."""
    from oospec.cli import build_parser
    from oospec.cli.options import sidecar_settings
    from oospec.sidecar.process import SidecarSettings

    parser = build_parser()
    commands = [["generate", "--messages", "m.json"], ["demo"], ["bench", "run"], ["bench", "serve"], ["serve"],
                ["serve", "--sidecar", SidecarSettings().model]]
    for argv in commands:
        assert sidecar_settings(parser.parse_args(argv)) == SidecarSettings(), argv


def _commands(parser, path=()):
    """(command words, parser) for every command that runs: the leaves of the subcommand tree."""
    import argparse

    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _commands(child, path + (name,))


def test_version_is_the_installed_packages(capsys):
    from importlib.metadata import version

    import oospec

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"oospec {version('oospec')}" == f"oospec {oospec.__version__}"


def test_every_command_that_limits_the_reply_length_names_it_alike():
    """One option, --max-new-tokens, with one default; only the server's is a fallback for requests that set no
    max_tokens. Earlier spellings still parse, hidden."""
    import argparse

    from oospec.cli import build_parser
    from oospec.models.registry import DEFAULT_MAX_NEW_TOKENS

    limits = {}
    for words, parser in _commands(build_parser()):
        shown = [(s, a.default) for a in parser._actions if a.help != argparse.SUPPRESS
                 for s in a.option_strings if "token" in s and "max" in s]
        if shown:
            limits[" ".join(words)] = shown
    assert {"generate", "demo", "bench run", "bench serve", "bench vllm", "sidecar traces", "serve"} <= set(limits)
    server = limits.pop("serve")
    assert server == [("--max-new-tokens", 1024)]
    assert all(shown == [("--max-new-tokens", DEFAULT_MAX_NEW_TOKENS)] for shown in limits.values()), limits
    parser = build_parser()
    assert parser.parse_args(["serve", "--default-max-tokens", "7"]).max_new_tokens == 7
    assert parser.parse_args(["bench", "serve", "--max-tokens", "9"]).max_new_tokens == 9


def test_the_benchmarks_choose_their_items_with_the_same_options():
    """bench run, serve, vllm and llamacpp: --dataset, --split, --data, --items, --offset, --limit, --held-out-only
    and --allow-trained-items, one definition (oospec.cli.options.add_item_options), one default each."""
    import argparse

    from oospec.cli import build_parser
    from oospec.cli.options import add_item_options

    own = argparse.ArgumentParser()
    add_item_options(own)
    want = {a.dest: (a.option_strings, a.default) for a in own._actions if a.dest != "help"}
    parser = build_parser()
    for words in (["bench", "run"], ["bench", "serve"], ["bench", "vllm"], ["bench", "llamacpp"]):
        sub = parser
        for word in words:
            sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        got = {a.dest: (a.option_strings, a.default) for a in sub._actions if a.dest in want}
        assert got == want, words
    args = parser.parse_args(["bench", "vllm", "--model", "m", "--dataset", "apibank:1,bfcl", "--dataset", "x",
                              "--items", "a, b"])
    from oospec.cli.options import item_selection

    assert item_selection(args) == {"datasets": ["apibank:1", "bfcl", "x"], "split": None, "data": [], "offset": 0,
                                    "limit": None, "items": ["a", "b"], "held_out_only": False,
                                    "allow_trained_items": False}


def test_every_command_that_runs_a_target_has_one_default_model():
    from oospec.cli import build_parser
    from oospec.models.registry import DEFAULT_TARGET

    parser = build_parser()
    for argv in (["generate", "--messages", "m.json"], ["demo"], ["serve"], ["bench", "run"], ["bench", "serve"],
                 ["bench", "cost-curve"], ["bench", "llamacpp"]):
        assert parser.parse_args(argv).model == DEFAULT_TARGET, argv
