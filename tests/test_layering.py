"""The package's layering, read from its imports: few imports inside functions (each one an optional
dependency, plotting kept out of the core, or a named layer break), no import cycle among the
module-level imports, imports that point down the layer order, and a core that loads no plotting.

Layer order (a module may import its own layer and those below it):
``config``, ``phase`` (and the helpers beside them) -> ``models/`` (with the zoo's catalog,
``models/catalog.py``: its names and the plain load of a shipped checkpoint) -> ``tasks/`` -> ``profile``,
``stats`` -> ``interventions/``, ``engines/``, ``theory/`` -> ``train/``, ``experiments/``,
``parallel/``, ``zoo/`` (the build recipes) -> ``plot/``, ``report/``, ``cli/``.
"""

from __future__ import annotations

import ast
import graphlib
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "phaseinterp"

MAX_FUNCTION_IMPORTS = 30  # issue 55: 69 before, 23 after (benchmarks/RESULTS.md)

LAYERS = [
    ("core", ["phaseinterp", "phaseinterp.config", "phaseinterp.phase", "phaseinterp.errors", "phaseinterp._checks",
              "phaseinterp._files", "phaseinterp.results"]),
    ("models", ["phaseinterp.models"]),
    ("tasks", ["phaseinterp.tasks"]),
    ("measures", ["phaseinterp.profile", "phaseinterp.stats"]),
    ("experiments", ["phaseinterp.interventions", "phaseinterp.engines", "phaseinterp.theory", "phaseinterp.paper"]),
    ("studies", ["phaseinterp.train", "phaseinterp.experiments", "phaseinterp.parallel", "phaseinterp.zoo"]),
    ("front", ["phaseinterp.plot", "phaseinterp.report", "phaseinterp.cli", "phaseinterp.__main__"]),
]

# Module-level imports that point up the layer order, each with why it is allowed. None today.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# Packages imported only inside the functions that need them: extras of pyproject.toml that the core
# does not install (transformers: transformer-lens asks for >= 5.9, while DeepSeek-V4's classes need the
# [hf] extra's >= 5.24).
OPTIONAL = {"transformers", "tokenizers", "kaleido", "llama_cpp", "llama_cpp_py_sync", "pyarrow", "datasets",
            "lm_eval"}
# Plotting is imported by the `plot()` methods only: the core never loads plotly (tested below).
PLOTTING = ("plotly", "phaseinterp.plot")
# Every other import inside a function, by (file, imported module or a package above it), with why it is
# not at the top.
LAZY_ON_PURPOSE = {
    ("phaseinterp/_checks.py", "torch"): "cli/args imports _checks: `phaseinterp --help` answers without torch",
    ("phaseinterp/_checks.py", "numpy"): "cli/args imports _checks: `phaseinterp --help` answers without numpy",
    ("phaseinterp/cli/__init__.py", "phaseinterp.cli.commands"): "`phaseinterp --help` answers without torch",
    ("phaseinterp/cli/__init__.py", "phaseinterp.zoo"): "`phaseinterp --help` answers without torch",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported_name(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names (``from phaseinterp import zoo``: ``phaseinterp.zoo``; a name
    that is no module of the package: the module it comes from)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    module = node.module or ""
    folder = REPO.joinpath(*module.split("."))
    subs = [f"{module}.{a.name}" for a in node.names
            if module.startswith("phaseinterp") and ((folder / f"{a.name}.py").is_file()
                                                     or (folder / a.name / "__init__.py").is_file())]
    return subs or [module]


def function_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, function, module)`` of every import statement inside a function (at any depth)."""
    found = []

    def walk(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = function or child.name
            if function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((child.lineno, function, name) for name in _imported_name(child))
            walk(child, inner)

    walk(ast.parse(path.read_text()), None)
    return found


def module_level_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported: outside functions, ``if TYPE_CHECKING:``
    bodies left out (class bodies, ``try`` and other ``if`` blocks included)."""
    found = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    walk(ast.Module(body=[other], type_ignores=[]))
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(ast.parse(path.read_text()))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the phaseinterp modules its module-level imports load: the module named, and every
    package above it that the importer is not itself inside (importing ``a.b.c`` runs ``a/b/__init__``)."""
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in module_level_imports(path):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: relative import (use phaseinterp.*)")
            for module in _imported_name(node):
                if not module.startswith("phaseinterp"):
                    continue
                if isinstance(node, ast.ImportFrom):
                    subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
                    targets.update(subs or [module])
                else:
                    targets.add(module)
                parts = module.split(".")
                targets.update(".".join(parts[:i]) for i in range(1, len(parts)))
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        graph[name] = {t for t in targets if t in modules and t not in own}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (a list of modules, the first repeated at the end), or []."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return []


def layer_of(module: str) -> int:
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = prefix == "phaseinterp"
            if module == prefix or (not exact and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it where it belongs")
    return best[0]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, deps in graph.items() for b in deps if layer_of(b) > layer_of(a))


def unexplained(path: Path, imports: list[tuple[int, str, str]]) -> list[str]:
    rel = path.relative_to(REPO).as_posix()
    bad = []
    for line, function, module in imports:
        parts = module.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)} | {"*"}
        if parts[0] in OPTIONAL or module.startswith(PLOTTING) or any((rel, p) in LAZY_ON_PURPOSE for p in prefixes):
            continue
        bad.append(f"{rel}:{line} ({function}): import {module}")
    return bad


def test_the_checks_can_fail(tmp_path):
    """Each checker finds what was planted: a function-level import, a cycle through a package's
    ``__init__``, an upward import, and an unexplained lazy import."""
    planted = tmp_path / "m.py"
    planted.write_text("import os\n\ndef f():\n    import json\n    def g():\n        from torch import nn\n"
                       "\nclass A:\n    def h(self):\n        import plotly\n")
    assert function_imports(planted) == [(4, "f", "json"), (6, "f", "torch"), (10, "h", "plotly")]
    assert [ast.unparse(n) for n in module_level_imports(planted)] == ["import os"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) and find_cycle({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "phaseinterp"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("from phaseinterp.models.a import x\n")
    (pkg / "models" / "a.py").write_text("from phaseinterp.tasks import y\nx = 1\n")
    (pkg / "tasks.py").write_text("from phaseinterp.models.b import z\ny = 1\n")
    (pkg / "models" / "b.py").write_text("z = 1\n")
    mods = {"phaseinterp": pkg / "__init__.py", "phaseinterp.models": pkg / "models" / "__init__.py",
            "phaseinterp.models.a": pkg / "models" / "a.py", "phaseinterp.models.b": pkg / "models" / "b.py",
            "phaseinterp.tasks": pkg / "tasks.py"}
    graph = import_graph(mods)
    assert graph["phaseinterp.tasks"] == {"phaseinterp.models", "phaseinterp.models.b"}  # the __init__ runs
    assert graph["phaseinterp.models.a"] == {"phaseinterp.tasks"}  # its own package's __init__ is no edge
    assert set(find_cycle(graph)) == {"phaseinterp.models", "phaseinterp.models.a", "phaseinterp.tasks"}
    assert upward_imports(graph) == [("phaseinterp.models.a", "phaseinterp.tasks")]
    assert layer_of("phaseinterp.models.hf.config") == 1 and layer_of("phaseinterp.phase") == 0
    assert unexplained(PACKAGE / "profile.py", [(1, "f", "json"), (2, "g", "transformers.x")]) == [
        "phaseinterp/profile.py:1 (f): import json"]


def test_few_imports_inside_functions():
    """At most MAX_FUNCTION_IMPORTS import statements sit inside functions, across the package."""
    counts = {path.relative_to(REPO).as_posix(): len(function_imports(path)) for path in _modules().values()}
    total = sum(counts.values())
    largest = sorted(((n, p) for p, n in counts.items() if n), reverse=True)[:8]
    assert total <= MAX_FUNCTION_IMPORTS, f"{total} imports inside functions (at most {MAX_FUNCTION_IMPORTS}): {largest}"


def test_every_import_inside_a_function_has_a_reason():
    """An import inside a function is an optional dependency, plotting, or listed in LAZY_ON_PURPOSE."""
    bad = [line for path in _modules().values() for line in unexplained(path, function_imports(path))]
    assert bad == [], "move these to the top of their module (or say in LAZY_ON_PURPOSE why not):\n" + "\n".join(bad)


def test_optional_packages_are_not_core_dependencies():
    """What OPTIONAL names is in no core dependency of pyproject.toml (else it belongs at the top)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower().replace("-", "_") for dep in project["dependencies"]}
    assert "torch" in core and OPTIONAL & core == set()


def test_no_import_cycle_at_module_level():
    cycle = find_cycle(import_graph(_modules()))
    assert cycle == [], " -> ".join(cycle)


def test_imports_follow_the_layer_order():
    modules = _modules()
    for name in modules:
        layer_of(name)  # every module has a layer
    upward = [edge for edge in upward_imports(import_graph(modules)) if edge not in ALLOWED_UPWARD]
    names = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})" for a, b in upward]
    assert names == [], "\n".join(names)


def test_import_phaseinterp_is_fast_and_loads_no_plotting():
    """A fresh ``import phaseinterp`` works, loads neither torch nor plotly, and takes well under a second."""
    code = ("import sys, time\nt = time.perf_counter()\nimport phaseinterp\nt = time.perf_counter() - t\n"
            "assert phaseinterp.__version__\n"
            "assert 'plotly' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\nprint(t)\n")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout) < 1.0, out.stdout
    assert time.perf_counter() - start < 30


CORE = ["phaseinterp.models", "phaseinterp.models.loading", "phaseinterp.models.catalog", "phaseinterp.models.hf",
        "phaseinterp.tasks", "phaseinterp.profile", "phaseinterp.stats", "phaseinterp.interventions",
        "phaseinterp.interventions.indexer", "phaseinterp.engines", "phaseinterp.theory"]


@pytest.mark.slow  # a fresh interpreter that imports torch
def test_the_core_loads_no_plotting():
    """Models, tasks, measures and experiments import without plotly, the plot/report packages, the CLI, training
    or the zoo's build recipes (the one loader reads the zoo's catalog, `phaseinterp.models.catalog`)."""
    code = (f"import sys\nfor name in {CORE!r}:\n    __import__(name)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'plotly' or m.startswith(('phaseinterp.plot', "
            "'phaseinterp.report', 'phaseinterp.cli', 'phaseinterp.train', 'phaseinterp.zoo')))\n"
            "assert bad == [], bad\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
