"""Imports point one way. Every import in the package, including those inside functions and under
TYPE_CHECKING, is read with `ast` and checked against the layering (lowest first):

    errors -> tools, models -> engine -> sidecar -> drafters -> datasets, pipeline
    -> {server, training, integrations} -> bench -> demo, cli

Outside the package and its tests (experiments/, examples/, any other script in the repository), code uses
oospec only through its public API, PUBLIC_API below: an internal that moves would break such a script silently.

A module may import its own package and anything in a lower layer; server, training and integrations (oospec
inside other engines) never import each other; bench, the one benchmark application, sits above them (it
measures the server and oospec inside vLLM), and none of them imports it; `oospec/__init__.py` (the public API) may import the
pipeline (oospec.load) and below. On top of the layers, no
two modules may import each other through any chain (a cycle), and neither may two packages.
"""

import ast
import importlib
import os
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "oospec"

LAYERS = [
    {"errors"},
    {"tools", "models"},
    {"engine"},
    {"sidecar"},
    {"drafters"},
    {"datasets", "pipeline"},  # pipeline: oospec.load, an engine with its drafter and sidecar
    {"server", "training", "integrations"},
    {"bench"},  # every benchmark, of the engine, the server (bench serve) and vLLM (bench vllm)
    {"demo", "cli", "__main__"},  # __main__: `python -m oospec`, if it ever exists, is a CLI entry point
]
LAYER = {name: rank for rank, names in enumerate(LAYERS) for name in names}
APPLICATIONS = {"server", "training", "integrations"}
ROOT = "oospec"  # oospec/__init__.py
LAYER[ROOT] = LAYER["pipeline"]  # the public API re-exports the engine and oospec.load

REPOSITORY = PACKAGE.parent
# What code outside the package may import: the top level (`oospec.load`, `oospec.Pipeline`, `oospec.Engine`,
# `oospec.__version__`) and the packages whose __init__ is a facade for users; never a module inside them.
# Each entry names what is promised from it (the module's own __all__ for the rest of its facade).
PUBLIC_API = {
    "oospec": ("load", "Pipeline", "Engine", "__version__"),
    "oospec.drafters": ("make_drafter", "DRAFTERS"),  # the drafters by method name
    "oospec.datasets": ("load_dataset", "Sample", "call_accuracy"),  # the benchmarks as chat samples
    "oospec.sidecar": ("SidecarClient", "Job", "Guess", "parse_payload"),  # the client and its protocol
}
INSIDE = {"oospec", "tests"}  # top-level folders that may import any module of the package
NOT_SOURCE = {"build", "dist", "runs", "node_modules", "__pycache__"}  # outputs and environments, not the project's


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


def scripts_outside_the_package() -> list[Path]:
    """Every .py file of the repository outside oospec/ and tests/ (hidden folders such as virtual environments
    and build outputs skipped)."""
    found = []
    for folder, subfolders, files in os.walk(REPOSITORY):
        here = Path(folder)
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d not in NOT_SOURCE
                               and not (here == REPOSITORY and d in INSIDE))
        found.extend(here / f for f in sorted(files) if f.endswith(".py"))
    return found


def private_imports(path: Path, modules: dict[str, Path]) -> list[str]:
    """`file:line imports module` for each oospec module the file imports that is not in PUBLIC_API."""
    where = path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path
    return [f"{where}:{line} imports {target}, not oospec's public API ({', '.join(PUBLIC_API)})"
            for line, target in imported_modules(path.stem, path, modules) if target not in PUBLIC_API]


def test_the_public_api_is_what_the_package_has():
    assert set(PUBLIC_API) <= set(module_files())
    for module, names in PUBLIC_API.items():
        facade = importlib.import_module(module)
        assert [n for n in names if not hasattr(facade, n)] == [], module


def test_a_script_outside_the_package_may_import_only_the_public_api(tmp_path):
    modules = module_files()
    script = tmp_path / "study.py"
    script.write_text("import oospec\nfrom oospec import Engine\nfrom oospec.drafters import make_drafter\n"
                      "from oospec.engine.tree import TokenTree\n"
                      "def f():\n    import oospec.sidecar.predictor as p\n    from oospec.datasets import loader\n")
    problems = private_imports(script, modules)
    assert [p.split(" imports ")[1].split(",")[0] for p in problems] == [
        "oospec.engine.tree", "oospec.sidecar.predictor", "oospec.datasets.loader"]
    scripts = scripts_outside_the_package()
    assert REPOSITORY / "examples" / "quickstart.py" in scripts
    assert not any(p.is_relative_to(PACKAGE) or p.is_relative_to(REPOSITORY / "tests") for p in scripts)


def test_experiments_and_examples_use_only_the_public_api():
    modules = module_files()
    problems = [p for path in scripts_outside_the_package() for p in private_imports(path, modules)]
    assert not problems, f"{len(problems)} import(s) of oospec internals outside the package:\n" + "\n".join(problems)


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
