"""Imports point one way. Every import in the package, including those inside functions and under
TYPE_CHECKING, is read with `ast` and checked against the layering (lowest first):

    errors -> tools, models -> engine -> sidecar -> drafters -> datasets, pipeline
    -> {bench, server, training, integrations} -> demo, cli

A module may import its own package and anything in a lower layer; bench, server, training and integrations
(oospec inside other engines) never import each other; `oospec/__init__.py` (the public API) may import the
pipeline (oospec.load) and below. On top of the layers, no
two modules may import each other through any chain (a cycle), and neither may two packages.
"""

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "oospec"

LAYERS = [
    {"errors"},
    {"tools", "models"},
    {"engine"},
    {"sidecar"},
    {"drafters"},
    {"datasets", "pipeline"},  # pipeline: oospec.load, an engine with its drafter and sidecar
    {"bench", "server", "training", "integrations"},
    {"demo", "cli", "__main__"},  # __main__: `python -m oospec`, if it ever exists, is a CLI entry point
]
LAYER = {name: rank for rank, names in enumerate(LAYERS) for name in names}
APPLICATIONS = {"bench", "server", "training", "integrations"}
ROOT = "oospec"  # oospec/__init__.py
LAYER[ROOT] = LAYER["pipeline"]  # the public API re-exports the engine and oospec.load


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) for every oospec module `name` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, one level up per extra dot
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from a.b import c` imports the module a.b.c when there is one, else a name defined in a.b
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import oospec.x.y as z` of a module; a name in a module
                target = target.rpartition(".")[0]
            if target.split(".")[0] == ROOT:
                found.append((node.lineno, target))
    return sorted(set(found))


def package_of(module: str) -> str:
    """The layer name of a module: oospec.engine.tree -> engine, oospec.errors -> errors, oospec -> oospec."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layering_violations() -> list[str]:
    files = module_files()
    graph = {name: imported_modules(name, path, files) for name, path in files.items()}
    problems = []
    for module, imports in sorted(graph.items()):
        source = package_of(module)
        where = files[module].relative_to(PACKAGE.parent)
        if source not in LAYER:
            problems.append(f"{where}: package {source!r} has no layer; add it to LAYERS in tests/test_layering.py")
            continue
        for line, target in imports:
            dest = package_of(target)
            if dest == source:
                continue
            if dest not in LAYER:
                problems.append(f"{where}:{line} imports {target}, in package {dest!r}, which has no layer")
            elif source in APPLICATIONS and dest in APPLICATIONS:
                problems.append(f"{where}:{line} {source} -> {dest}: applications never import each other ({target})")
            elif LAYER[dest] > LAYER[source]:
                problems.append(f"{where}:{line} {source} -> {dest}: upward import of {target}")

    module_edges = {m: {t for _, t in imports if t != m} for m, imports in graph.items()}
    for component in cycles(module_edges):
        problems.append("module cycle: " + " <-> ".join(component))
    package_edges: dict[str, set[str]] = {}
    for module, targets in module_edges.items():
        package_edges.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module))
    for component in cycles(package_edges):
        problems.append("package cycle: " + " <-> ".join(component))
    return problems


def test_the_reader_sees_imports_inside_functions_and_relative_ones(tmp_path):
    modules = {"oospec": None, "oospec.engine": None, "oospec.engine.tree": None, "oospec.drafters": None,
               "oospec.drafters.base": None}
    source = tmp_path / "decode.py"
    source.write_text("import numpy\nfrom . import tree\nfrom .tree import ROOT\n"
                      "def f():\n    from oospec.drafters.base import Request\n    import oospec.drafters\n")
    found = imported_modules("oospec.engine.decode", source, modules)
    assert found == [(2, "oospec.engine.tree"), (3, "oospec.engine.tree"), (5, "oospec.drafters.base"),
                     (6, "oospec.drafters")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_follow_the_layers_without_cycles():
    problems = layering_violations()
    print("\n".join(problems))
    assert not problems, f"{len(problems)} layering violation(s):\n" + "\n".join(problems)
