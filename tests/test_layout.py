"""The package's layout (issue 21): no import cycle inside phaseinterp/, no module that re-exports
names it does not use (outside a package's public ``__init__``), at most 8 modules directly under
phaseinterp/ (README's "What is where" says how many and lists every package), and lazy attribute
access to every package from a fresh interpreter without loading torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "phaseinterp"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the phaseinterp modules it imports anywhere (top level or inside a function)."""
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("phaseinterp"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("phaseinterp")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def reexports(path: Path) -> list[str]:
    """Names imported from phaseinterp into ``path`` and never used in it (a re-export)."""
    tree = ast.parse(path.read_text())
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("phaseinterp"):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return sorted(full for local, full in imported.items() if local not in used)


def test_the_checks_can_fail():
    """The cycle finder finds a planted cycle; the re-export finder finds a planted re-export."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_the_package():
    assert cycles(import_graph(_modules())) == []


def test_no_module_re_exports_names(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("from phaseinterp.stats import wilson_interval  # noqa: F401\n")
    assert reexports(planted) == ["phaseinterp.stats.wilson_interval"]
    offenders = {name: r for name, path in _modules().items() if path.name != "__init__.py" and (r := reexports(path))}
    assert offenders == {}
    for name, path in _modules().items():  # a package's public API never includes private names
        if path.name == "__init__.py":
            private = [n for n in reexports(path) if n.rsplit(".", 1)[1].startswith("_")]
            assert private == [], (name, private)


def test_few_top_level_modules_and_readme_lists_every_package():
    top = sorted(p.stem for p in ROOT.glob("*.py") if not p.stem.startswith("__"))
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    assert len(top) <= 8, top
    readme = (ROOT.parent / "README.md").read_text()
    where = readme[readme.index("## What is where"):]
    where = where[: where.index("\n## ", 1)]
    count = re.search(r"(\d+) modules directly under `phaseinterp/`", where)
    assert count and int(count.group(1)) == len(top), (count and count.group(0), top)
    missing = [p for p in packages if f"`phaseinterp.{p}`" not in where]
    assert missing == [], missing


@pytest.mark.slow  # spawns a fresh interpreter
def test_every_package_is_an_attribute_of_a_fresh_phaseinterp():
    """``pi.parallel``, ``pi.experiments``, ... load on first use; ``import phaseinterp`` loads no torch."""
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    code = ("import sys, phaseinterp as pi\nassert 'torch' not in sys.modules\n"
            f"for name in {packages!r}:\n    getattr(pi, name)\n"
            "pi.parallel.sharded_ablate, pi.experiments.compare_remedy, pi.train.train, pi.report.build_report\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# Experiments read a model only through the protocol (`phaseinterp.models.protocol.phase_model`), so a
# third model family is added in one place (issue 35, item 4). Outside models/, none of these probes:
FAMILY_PROBES = re.compile(r"hasattr\(model\b|cfg\.compression\b|kv_head_groups\(\)|f\"blocks\.\{")
PROBES_ALLOWED = {
    "phaseinterp/train/deepseek_v4.py": "trains the DeepSeek-V4 family itself: its own hook names",
    "phaseinterp/engines/adapters.py": "tells a bare transformers model (no phaseinterp family) by its generate()",
    "phaseinterp/cli/commands.py": "checks set_query_chunk before a long --query-chunk run (CLI only)",
}


def find_family_probes(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "phaseinterp").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("phaseinterp/models/") or rel in PROBES_ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FAMILY_PROBES.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_experiments_read_models_only_through_the_protocol(tmp_path):
    assert find_family_probes(ROOT.parent) == []
    planted = tmp_path / "phaseinterp" / "interventions"
    planted.mkdir(parents=True)
    (planted / "x.py").write_text("def f(model):\n    return model.cfg.compression == 'deepseek'\n")
    assert find_family_probes(tmp_path) == ["phaseinterp/interventions/x.py:2: return model.cfg.compression == 'deepseek'"]
