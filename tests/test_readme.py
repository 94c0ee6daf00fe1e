"""The README (and docs/) against the code, so that what a newcomer copies works.

- Every `oospec` command in README.md and docs/*.md is parsed by the real argument parser: each flag it names
  must be an option of that command (spelled out, not abbreviated) and every value must be accepted.
- A fenced block right after `<!-- ci: run -->` is run (SmolLM2, small limits; `--out` goes to a temporary
  folder). Python blocks after `<!-- ci: exec -->` are executed in order in one namespace, as a reader pastes
  them, with SmolLM2 as the target and a scripted sidecar; the block after `<!-- ci: server -->` talks to a real
  `oospec serve` on SmolLM2. Other Python blocks must compile.
- `make` targets exist, `pip install -e '.[extra]'` extras exist, files that commands and links name exist,
  links to headings point at headings; examples/*.json load and examples/quickstart.py runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from oospec.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- ci: (\w+) -->$")
SMOLLM2 = "smollm2-135m"


@dataclass
class Block:
    lang: str
    code: str
    mark: str | None  # the `<!-- ci: ... -->` right above it, if any
    where: str  # file:line, for messages


def fenced_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, mark, i = [], None, 0
    while i < len(lines):
        line = lines[i].strip()
        if MARK.match(line):
            mark = MARK.match(line).group(1)
        elif line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            blocks.append(Block(line[3:].strip(), "\n".join(lines[i + 1:end]), mark, f"{page.name}:{i + 1}"))
            mark, i = None, end
        elif line:
            mark = None  # a marker applies to the block right below it only
        i += 1
    return blocks


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuations joined, comments dropped, `&&` and `;` split, leading
    VAR=value assignments dropped."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        current: list[str] = []
        for token in shlex.split(line, comments=True) + [";"]:
            if token in ("&&", ";", "||"):
                while current and re.match(r"^[A-Z_]+=", current[0]):
                    current.pop(0)
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(token)
    return commands


def _blocks(lang: tuple[str, ...], mark: str | None = "any") -> list[Block]:
    return [b for page in PAGES for b in fenced_blocks(page)
            if b.lang in lang and (mark == "any" or b.mark == mark)]


SHELL = ("bash", "sh", "shell", "console")
ALL_COMMANDS = [(b.where, cmd) for b in _blocks(SHELL) for cmd in shell_commands(b.code)]
OOSPEC_COMMANDS = [(where, cmd) for where, cmd in ALL_COMMANDS if Path(cmd[0]).name == "oospec"]


def _subparser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command that `argv` names: `bench run ...` -> the parser of `bench run`."""
    for word in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser = sub.choices[word]
    return parser


def _argv(cmd: list[str]) -> list[str]:
    """The arguments after `oospec`, with optional parts written `[--flag value]` taken as given."""
    return [t.lstrip("[").rstrip("]") for t in cmd[1:] if t.lstrip("[").rstrip("]")]


def test_the_pages_have_commands_and_marked_blocks():
    assert len(OOSPEC_COMMANDS) >= 15, "the command extraction found too little: is the fence syntax still ```bash?"
    marks = [b.mark for b in _blocks(SHELL + ("python",), mark="any") if b.mark]
    assert marks.count("run") >= 1 and marks.count("exec") >= 1 and marks.count("server") == 1


@pytest.mark.parametrize("where,cmd", OOSPEC_COMMANDS, ids=[f"{w} {' '.join(c[1:3])}" for w, c in OOSPEC_COMMANDS])
def test_every_oospec_command_parses(where, cmd, capsys):
    argv = _argv(cmd)
    parser = build_parser()
    options = {s for a in _subparser(parser, argv)._actions for s in a.option_strings}
    unknown = [t.split("=")[0] for t in argv if t.startswith("--") and t.split("=")[0] not in options]
    assert not unknown, f"{where}: `{shlex.join(cmd)}` names options its command does not have: {unknown}"
    try:
        parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `{shlex.join(cmd)}` is refused by the parser: {capsys.readouterr().err.strip()}")


def test_make_pip_and_python_commands_name_what_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    checked = 0
    for where, cmd in ALL_COMMANDS:
        prog = Path(cmd[0]).name
        if prog == "make":
            assert set(cmd[1:]) <= targets, f"{where}: no such make target in {cmd[1:]}"
        elif prog == "pip" or cmd[:3] == ["python", "-m", "pip"]:
            for spec in (t for t in cmd if t.startswith(".[")):
                assert set(spec[2:-1].split(",")) <= extras, f"{where}: unknown extra in {spec}"
        elif prog.startswith("python") and len(cmd) > 1 and cmd[1].endswith(".py"):
            assert (ROOT / cmd[1]).is_file(), f"{where}: {cmd[1]} does not exist"
        elif prog.startswith("python") and cmd[1:2] == ["-m"] and cmd[2].startswith("oospec"):
            assert importlib.util.find_spec(cmd[2]), f"{where}: no module {cmd[2]}"
        else:
            continue
        checked += 1
    assert checked >= 4


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_point_at_files_and_headings():
    anchors = {page: {_slug(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), re.M)} for page in PAGES}
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: link to a missing file {target}"
            if anchor:
                assert anchor in anchors.get(file, set()), f"{page.name}: link to a missing heading {target}"


def test_python_blocks_compile():
    for block in _blocks(("python",)):
        compile(block.code, block.where, "exec")


# -- the examples -------------------------------------------------------------------------------------------
def test_example_files_load():
    from oospec.engine.engine import validate_messages
    from oospec.tools.schema import tools_from_openai

    messages = json.loads((ROOT / "examples" / "messages.json").read_text())
    tools = json.loads((ROOT / "examples" / "tools.json").read_text())
    assert validate_messages(messages) and messages[-1]["role"] == "user"
    assert [t.name for t in tools_from_openai(tools)] == ["create_calendar_event", "get_weather"]


@pytest.fixture
def smollm2_everywhere(monkeypatch, smollm2_engine):
    """Engine.from_pretrained gives the SmolLM2 engine whatever it is asked for; SidecarClient starts a scripted
    sidecar (tests/sidecar_fakes.py) in its own process instead of loading a model."""
    import oospec.sidecar
    from oospec.engine.engine import Engine

    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, name, **kw: smollm2_engine))
    real_client = oospec.sidecar.SidecarClient
    monkeypatch.setattr(oospec.sidecar, "SidecarClient", lambda model=None, **kw: real_client(
        factory="sidecar_fakes:make_fake", factory_options={"mode": "good"}, threads=1))
    return smollm2_engine


def test_quickstart_example_is_lossless(smollm2_everywhere, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import quickstart
    finally:
        sys.path.remove(str(ROOT / "examples"))
    result = quickstart.main(["--model", SMOLLM2, "--max-new-tokens", "16"])
    assert result["identical"] and result["plain"].stats.new_tokens > 0
    assert "token ids identical: True" in capsys.readouterr().out


# -- the blocks CI runs -------------------------------------------------------------------------------------
def test_ci_shell_blocks_run(smollm2_path, tmp_path, monkeypatch, capsys):
    """The README's quick checks, as written (SmolLM2); each `--out` goes to a temporary folder."""
    monkeypatch.chdir(ROOT)
    commands = [(b.where, cmd) for b in _blocks(SHELL, mark="run") for cmd in shell_commands(b.code)]
    assert commands
    for n, (where, cmd) in enumerate(commands):
        assert Path(cmd[0]).name == "oospec", f"{where}: CI runs oospec commands only, not {cmd[0]}"
        argv = _argv(cmd)
        if "--out" in argv:
            argv[argv.index("--out") + 1] = str(tmp_path / f"out-{n}")
        rc = main(argv)
        out, err = capsys.readouterr()
        assert rc == 0, f"{where}: `{shlex.join(cmd)}` failed: {err[-2000:]}"
        if argv[:2] == ["bench", "run"]:  # the short table, the report's path and the small-sample warning
            assert f"report: {tmp_path / f'out-{n}' / 'report.md'}" in out and "WARNING: few items" in out
            assert (tmp_path / f"out-{n}" / "speedup.png").is_file()
        if argv[:1] == ["generate"]:
            assert "target forwards" in out + err


def _substituted(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"the README snippet no longer contains {old!r}: update this test's substitutions"
        code = code.replace(old, new)
    return code


def test_ci_python_blocks_run_in_order(smollm2_everywhere, capsys):
    namespace: dict = {"__name__": "readme"}
    blocks = _blocks(("python",), mark="exec")
    assert blocks
    for block in blocks:
        code = block.code.replace("max_new_tokens=128", "max_new_tokens=32")
        exec(compile(code, block.where, "exec"), namespace)
    assert namespace["result"].stats.new_tokens > 0
    assert namespace["result"].tokens.tolist() == namespace["plain"].tokens.tolist()


def test_ci_server_block_against_a_real_server(smollm2_path, tmp_path):
    from test_server import KEY, Server

    (block,) = _blocks(("python",), mark="server")
    server = Server(tmp_path, "--max-new-tokens", "32")
    try:
        code = _substituted(block.code, {"http://127.0.0.1:8000/v1": server.url + "/v1", 'api_key="KEY"':
                                         f'api_key="{KEY}"', 'model="qwen2.5-coder-1.5b"': f'model="{SMOLLM2}"'})
        namespace: dict = {"__name__": "readme"}
        exec(compile(code, block.where, "exec"), namespace)
        assert namespace["reply"].choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        assert server.stop() == 0, server.output()


def test_readme_benchmarks_with_a_sidecar_run_held_out_items():
    """`bench run` refuses, for sidecar methods, items the shipped adapter was trained on: a README command that
    asks for them would stop with that error, so every such command must ask for held-out items only."""
    from oospec.bench.items import Selection, select
    from oospec.bench.methods import parse_methods, uses_sidecar
    from oospec.cli.options import item_selection
    from oospec.sidecar.process import resolve_adapter

    checked = 0
    for where, cmd in OOSPEC_COMMANDS:
        argv = _argv(cmd)
        if not where.startswith("README") or argv[:2] != ["bench", "run"]:
            continue
        args = build_parser().parse_args(argv)
        if args.allow_trained_items or not any(uses_sidecar(m) for m in parse_methods(args.methods)):
            continue
        adapter = resolve_adapter(args.sidecar_model, args.sidecar_adapter)
        # The items the command selects, as every bench selects them (--offset, --held-out-only, --limit).
        selection = Selection(**{**item_selection(args), "allow_trained_items": True}, sessions=args.sessions)
        assert select(selection, adapter)[1] == [], f"{where}: `{shlex.join(cmd)}`"
        checked += 1
    assert checked >= 2
