"""House rules that no other test checks: comments explain rather than log history, the lab stays pruned, and
plots stay an optional extra.

- No comment or docstring in oospec/ carries a date (YYYY-MM-DD) or an issue reference ("issue 18", "#18"): the
  history of a line is in git; a comment says why the code is as it is. Comments are read with `tokenize`,
  docstrings (module, class, function) with `ast`, so strings the code uses are not checked; a value written as
  code (in backticks, such as an example date `2023-04-15`) is not history.
- experiments/results/ keeps the runs the README and docs cite: at most MAX_RESULT_FOLDERS folders (the rest are
  in git history, docs/experiments.md).
- matplotlib is the `plot` extra, not a core dependency: without it, a plot is refused with one line naming the
  extra, and the package imports.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest

from oospec.errors import MissingExtraError, optional_import

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "oospec"
MAX_RESULT_FOLDERS = 20
# A date, or an issue named by number: "issue 18", "issues 14 and 18", "#18" (not "#" alone, nor "0x1f").
HISTORY = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\bissues?\s+#?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)
CODE = re.compile(r"`[^`]*`")  # a value written as code: an example, not a date in the code's history


def logs_history(text: str) -> bool:
    return HISTORY.search(CODE.sub("", text)) is not None


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in a Python file."""
    source = path.read_text(encoding="utf-8")
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.extend((first.lineno + k, line) for k, line in enumerate(first.value.value.splitlines()))
    return sorted(found)


def history_in_comments(root: Path = PACKAGE) -> list[str]:
    """`file:line: text` for each comment or docstring line under `root` that names a date or an issue."""
    return [f"{path.relative_to(root.parent)}:{line}: {text.strip()}"
            for path in sorted(root.rglob("*.py")) for line, text in comments_and_docstrings(path)
            if logs_history(text)]


def test_the_history_pattern_finds_dates_and_issues_only():
    for logged in ("# measured 2026-12-04", "# see issue 18", "# issues 14 and 18", "# (#42)", "# Issue #7 asked",
                   "# `code` then 2026-12-04"):
        assert logs_history(logged), logged
    for plain in ("# 286 tokens", "# a&#38;b", "# page #", "# 0x1f", "# 12-04", "# as `2023-04-15 14:00`"):
        assert not logs_history(plain), plain


def test_the_scan_reads_comments_and_docstrings_not_strings(tmp_path):
    (tmp_path / "m.py").write_text('"""Module, 2026-12-04."""\n\nX = "issue 18"  # a comment on issue 19\n\n\n'
                                   'def f():\n    """Line one.\n\n    Found in #20."""\n    return "2026-01-01"\n')
    assert [f.split(": ", 1)[1] for f in history_in_comments(tmp_path)] == [
        "Module, 2026-12-04.", "# a comment on issue 19", "Found in #20."]


def test_no_comment_in_the_package_logs_history():
    found = history_in_comments()
    assert not found, (f"{len(found)} comment or docstring line(s) in oospec/ carry a date or an issue number; "
                       "say why the code is so instead (git keeps the history):\n" + "\n".join(found))


def test_experiments_results_keeps_at_most_twenty_folders():
    folders = sorted(p.name for p in (ROOT / "experiments" / "results").iterdir() if p.is_dir())
    assert folders and len(folders) <= MAX_RESULT_FOLDERS, (
        f"{len(folders)} result folders; keep the runs the README and docs cite, point the others at git history")


def test_matplotlib_is_the_plot_extra_not_a_core_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plot"])
    assert "oospec[plot]" in project["optional-dependencies"]["test"]  # the tests check the plots


def test_a_missing_extra_is_one_line_naming_it():
    with pytest.raises(MissingExtraError, match=r"^no_such_module_x is not installed: pip install 'oospec\[plot\]'$"):
        optional_import("no_such_module_x", "plot")


def test_without_matplotlib_the_package_imports_and_a_plot_is_refused_by_name(tmp_path):
    """matplotlib blocked (as where the extra is not installed): the modules that plot import, and a plot says
    which extra it needs instead of a traceback."""
    script = ("import sys\nsys.modules['matplotlib'] = None\n"
              "import oospec, oospec.bench.run, oospec.bench.vllm, oospec.training.lora\n"
              "from oospec.bench.report import plot_speedup\nfrom oospec.errors import MissingExtraError\n"
              "try:\n    plot_speedup({}, [], __import__('pathlib').Path(sys.argv[1]))\n"
              "except MissingExtraError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "p.png")], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "matplotlib is not installed: pip install 'oospec[plot]'"
    assert not (tmp_path / "p.png").exists()
