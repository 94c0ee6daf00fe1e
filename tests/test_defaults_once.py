"""Each option default is written once. An option that sets a field of a dataclass (or a parameter of the
function its command calls) takes that default from there, never a literal of its own.

Two checks:
- the defaults agree: each command's options, parsed with nothing given and read back the way the command reads
  them (`server_config`, `bench_config`, `train_config`, `sidecar_settings`, `item_selection`), build the
  dataclass's own default, field by field;
- no literal is re-typed: no CLI module writes `default=<literal>` for an option that one of those readers
  reads. A literal equal to the dataclass's value passes the first check today and drifts from it tomorrow;
  this check fails at once.
"""

import argparse
import ast
import inspect
from dataclasses import fields
from pathlib import Path

import pytest

from oospec.bench.config import BenchConfig
from oospec.bench.items import Selection
from oospec.cli import build_parser
from oospec.cli.bench import bench_config
from oospec.cli.generate import generate_request
from oospec.cli.options import item_selection, sidecar_settings
from oospec.cli.serve import API_KEY_ENV, server_config
from oospec.cli.training import train_config
from oospec.engine.drafting import Request
from oospec.models.registry import DEFAULT_TARGET
from oospec.server.config import ServerConfig
from oospec.sidecar.process import SidecarSettings
from oospec.training.config import TrainConfig

CLI = Path(__file__).resolve().parents[1] / "oospec" / "cli"
REQUIRED = {("generate",): ["--messages", "m.json"], ("bench", "vllm"): ["--model", "m"],
            ("sidecar", "tune"): ["--adapter", "a"], ("models", "pull"): ["name"], ("bench", "project"): ["run"],
            ("models", "synth-gguf"): ["out.gguf"]}


# The reply limit of `generate` is every command's (the registry's DEFAULT_MAX_NEW_TOKENS), not a Request's.
GENERATE_OWN = {"max_new_tokens"}

# (command, how the command reads its options (a function of oospec.cli), its result as the dataclass,
#  that dataclass's defaults)
READERS = [
    (("serve",), server_config, None, ServerConfig(model_name=DEFAULT_TARGET)),
    (("bench", "run"), bench_config, None, BenchConfig()),
    (("sidecar", "train"), train_config, None, TrainConfig()),
    *[(command, item_selection, lambda chosen: Selection(**chosen), Selection())
      for command in (("bench", "run"), ("bench", "serve"), ("bench", "vllm"))],
    *[(command, sidecar_settings, None, SidecarSettings())
      for command in (("generate",), ("demo",), ("serve",), ("bench", "run"), ("bench", "serve"))],
    (("generate",), lambda args: generate_request(args, None, None), None, Request()),
]


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every leaf command, e.g. (("bench", "run"), its parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from subcommands(sub, path + (name,))


def parse_defaults(command: tuple[str, ...]) -> argparse.Namespace:
    return build_parser().parse_args([*command, *REQUIRED.get(command, [])])


def as_fields(value) -> dict:
    return value if isinstance(value, dict) else {f.name: getattr(value, f.name) for f in fields(value)}


@pytest.mark.parametrize("command, read, build, expected", READERS,
                         ids=[f"{' '.join(c)}->{type(e).__name__}" for c, _, _, e in READERS])
def test_a_bare_command_line_builds_the_dataclass_defaults(command, read, build, expected, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    built = read(parse_defaults(command))
    built, wanted = as_fields(build(built) if build else built), as_fields(expected)
    own = GENERATE_OWN if command == ("generate",) else set()
    differ = {name: (built[name], wanted[name]) for name in wanted.keys() - own if built[name] != wanted[name]}
    assert not differ, f"`oospec {' '.join(command)}` defaults (option, dataclass): {differ}"


def test_every_command_parses_with_nothing_but_its_required_options():
    """The readers above cover the commands that build a dataclass; every command is parsed by that rule."""
    for path, _ in subcommands(build_parser()):
        assert parse_defaults(path).func is not None, path


def function_options():
    """(command, function, {parameter: option dest}) of the commands that pass options to a function's
    parameters rather than build a dataclass (see each command's cmd_* function)."""
    from oospec.bench import serve
    from oospec.models.synthetic_gguf import write_random_gguf
    from oospec.training.pool import pool_sources, training_pool
    from oospec.training.split import split_traces
    from oospec.training.traces import record_traces

    return [
        (("bench", "serve"), serve.run, {"max_tokens": "max_new_tokens", "prefix_cache_mb": "prefix_cache_mb",
                                         "threads": "threads", "dtype": "dtype", "device": "device"}),
        (("sidecar", "traces"), record_traces, {"max_new_tokens": "max_new_tokens"}),
        (("sidecar", "traces"), training_pool, {"seed": "seed", "rounds": "rounds"}),
        (("sidecar", "traces"), pool_sources, {"scale": "scale"}),
        (("sidecar", "split"), split_traces, {"seed": "seed", "fractions": "fractions"}),
        (("models", "synth-gguf"), write_random_gguf, {"seed": "seed", "tokenizer_from": "tokenizer_from"}),
    ]


def option_value(args: argparse.Namespace, dest: str):
    """An option's value as the command passes it (--fractions: a comma list of floats)."""
    value = getattr(args, dest)
    return tuple(float(x) for x in value.split(",")) if dest == "fractions" else value


def test_the_functions_commands_call_take_the_options_defaults():
    """Commands that call a function with their options rather than build a dataclass: the same defaults."""
    for command, function, passed in function_options():
        args, signature = parse_defaults(command), inspect.signature(function).parameters
        differ = {param: (option_value(args, dest), signature[param].default) for param, dest in passed.items()
                  if option_value(args, dest) != signature[param].default}
        assert not differ, f"`oospec {' '.join(command)}` vs {function.__qualname__} (option, parameter): {differ}"


# -- no literal written twice -------------------------------------------------------------------------------

def option_dest(call: ast.Call, keywords: dict) -> str | None:
    """The dest of `p.add_argument("--name", ..., dest=...)`, or of a helper `add_name_option(p, default=...)`."""
    if isinstance(keywords.get("dest"), ast.Constant):
        return keywords["dest"].value
    for arg in call.args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
            return arg.value[2:].replace("-", "_")
    name = getattr(call.func, "id", getattr(call.func, "attr", ""))
    if name.startswith("add_") and name.endswith("_option"):
        return name[len("add_"):-len("_option")]
    return None


def is_literal(node: ast.expr) -> bool:
    """A value typed in place (a number, a string, a list of them); None and flags (True/False) are not
    defaults worth defining elsewhere."""
    if isinstance(node, ast.Constant):
        return node.value is not None and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return is_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(is_literal(e) for e in node.elts)
    return False


def commands_of(tree: ast.Module) -> dict[int, str]:
    """Line -> the command its options belong to: the name of the last `p = add_command(parent, "name", ...)`
    before it in its function; "*" in a function that adds options for any command (the shared helpers)."""
    owner = {}
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        current = "*"
        for node in sorted((n for n in ast.walk(function) if hasattr(n, "lineno")), key=lambda n: n.lineno):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "add_command"
                    and isinstance(node.args[1], ast.Constant)):
                current = node.args[1].value
            owner.setdefault(node.lineno, current)
    return owner


def literal_defaults() -> list[tuple[str, int, str, str, str]]:
    """(file, line, command, dest, the literal) of every literal option default written in the CLI modules:
    `default=...` of an option, and a helper's `default`/`<name>_default` parameter or argument."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text())
        owner = commands_of(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                keywords = {k.arg: k.value for k in node.keywords if k.arg}
                for key, value in keywords.items():
                    if (key == "default" or key.endswith("_default")) and is_literal(value):
                        dest = option_dest(node, keywords) if key == "default" else key[: -len("_default")]
                        found.append((path.name, node.lineno, owner.get(node.lineno, "*"), dest,
                                      ast.unparse(value)))
            elif isinstance(node, ast.FunctionDef):
                arguments = node.args.posonlyargs + node.args.args
                pairs = list(zip(arguments[len(arguments) - len(node.args.defaults):], node.args.defaults))
                pairs += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None]
                for arg, value in pairs:
                    if (arg.arg == "default" or arg.arg.endswith("_default")) and is_literal(value):
                        dest = (node.name[len("add_"):].removesuffix("_options").removesuffix("_option")
                                if arg.arg == "default" else arg.arg[: -len("_default")])
                        found.append((path.name, node.lineno, "*", dest, ast.unparse(value)))
    return found


def read_options() -> dict[tuple[str, str], set[str]]:
    """(the CLI file that defines a command, the command's name) -> the options (dests) its readers turn into
    dataclass fields (every `args.<dest>` the reader's source reads; a lambda here stands for the oospec.cli
    function it calls) or pass to a function's parameters (`function_options`)."""
    read: dict[tuple[str, str], set[str]] = {}
    for command, reader, _, _ in READERS:
        function = generate_request if reader.__name__ == "<lambda>" else reader
        dests = {n.attr for n in ast.walk(ast.parse(inspect.getsource(function)))
                 if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "args"}
        file = parse_defaults(command).func.__module__.rsplit(".", 1)[-1] + ".py"
        own = GENERATE_OWN if command == ("generate",) else set()
        read.setdefault((file, command[-1]), set()).update(dests - own)
    for command, _, passed in function_options():
        file = parse_defaults(command).func.__module__.rsplit(".", 1)[-1] + ".py"
        read.setdefault((file, command[-1]), set()).update(passed.values())
    return read


def retyped(found, read) -> list[str]:
    everywhere = set().union(*read.values())
    return [f"oospec/cli/{file}:{line}: `{command}` option {dest} defaults to the literal {value}: take the "
            f"default of the dataclass field (or the parameter) it sets"
            for file, line, command, dest, value in found
            if dest in (everywhere if command == "*" else read.get((file, command), ()))]


def test_the_readers_read_the_options_they_check():
    """The scan below knows which options feed a dataclass from the readers' sources: they must name them."""
    read = read_options()
    assert {"max_queue", "request_timeout", "max_new_tokens", "budget", "body_timeout"} <= read["serve.py", "serve"]
    assert {"r", "alpha", "lr", "epochs", "seed"} <= read["training.py", "train"]
    assert {"offset", "limit", "methods", "seed", "sidecar_threads", "dtype", "device"} <= read["bench.py", "run"]
    assert {"offset", "limit", "sidecar_threads", "device"} <= read["bench.py", "serve"]
    assert {"temperature", "top_p", "top_k", "seed"} <= read["generate.py", "generate"]
    assert {"seed", "scale", "rounds", "max_new_tokens"} <= read["training.py", "traces"]


def test_the_scan_finds_a_retyped_literal():
    """The scan sees a literal where a dataclass's default belongs, in a command and in a shared helper, and
    lets literals of options no dataclass holds pass."""
    read = read_options()
    planted = [("serve.py", 1, "serve", "max_queue", "8"), ("options.py", 2, "*", "sidecar_threads", "1"),
               ("training.py", 3, "train", "r", "16"), ("bench.py", 4, "run", "methods", "'ar,pld'"),
               ("training.py", 5, "split", "fractions", "'0.7,0.15,0.15'"),
               ("bench.py", 6, "vllm", "max_model_len", "4096"), ("bench.py", 7, "serve", "methods", "'ar'")]
    assert [m.split(":")[1] for m in retyped(planted, read)] == ["1", "2", "3", "4", "5"]


def test_no_option_default_is_a_retyped_literal():
    found = literal_defaults()
    assert any(dest == "port" for _, _, _, dest, _ in found)  # the scan reads the CLI modules
    problems = retyped(found, read_options())
    assert not problems, "\n".join(problems)
