"""The decode loop stays readable: every function in oospec/engine/decode.py fits on one screen."""

import ast
from pathlib import Path

import oospec.engine.decode

MAX_LINES = 60


def function_lengths(path: Path) -> dict[str, int]:
    """Lines of every function (nested ones too) in `path`, decorators and docstring included."""
    tree = ast.parse(path.read_text())
    return {node.name: node.end_lineno - min([node.lineno] + [d.lineno for d in node.decorator_list]) + 1
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_function_in_the_decode_loop_is_longer_than_a_screen():
    lengths = function_lengths(Path(oospec.engine.decode.__file__))
    assert "generate" in lengths and lengths["generate"] > 10  # the measure reads the real loop
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"functions over {MAX_LINES} lines: {too_long}"


def test_the_measure_counts_a_long_function(tmp_path):
    source = tmp_path / "long.py"
    source.write_text("def f():\n" + "    x = 1\n" * 70 + "\n\ndef g():\n    return 1\n")
    assert function_lengths(source) == {"f": 71, "g": 2}
