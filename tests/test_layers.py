"""The package's import graph: layers stand under the ones that use them, and nothing cycles.

Every `import` in src/vlcache counts, also those inside functions (imported lazily to keep
optional dependencies optional), except imports under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import vlcache

ROOT = Path(vlcache.__file__).parent

# Lowest first; a module may import from its own layer and the layers before it.
LAYERS: list[set[str]] = [
    {"plan", "keys", "entry", "kernels"},
    {"models"},
    {"reuse", "stores"},
    {"engine"},
    {"workloads"},
    {"planner"},
    {"eval", "bench", "server"},
    {"commands", "cli"},
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m == "vlcache" or m.startswith("vlcache.")}


def graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = {t for t in _imports(path, name) if t in modules and t != name}
        edges[name] = targets
    return edges


def _layer(module: str) -> int | None:
    top = module.split(".")[1] if "." in module else ""
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    return None


def test_every_subpackage_has_a_layer():
    tops = {m.split(".")[1] for m in graph() if m.count(".") >= 1}
    assert tops <= set().union(*LAYERS), tops - set().union(*LAYERS)


def test_no_module_imports_from_a_higher_layer():
    wrong = [f"{a} -> {b}" for a, targets in graph().items() for b in targets
             if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)]
    assert wrong == []


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_check_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    pkg = tmp_path / "vlcache"
    (pkg / "reuse").mkdir(parents=True)
    (pkg / "engine").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "reuse" / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "reuse" / "a.py").write_text("from vlcache.reuse import b\n"
                                        "def f():\n    from vlcache.engine import run\n")
    (pkg / "reuse" / "b.py").write_text("from . import a\n")
    (pkg / "engine" / "run.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    edges = graph()
    assert edges["vlcache.reuse.a"] == {"vlcache.reuse", "vlcache.reuse.b", "vlcache.engine",
                                        "vlcache.engine.run"}
    assert edges["vlcache.reuse.b"] == {"vlcache.reuse", "vlcache.reuse.a"}
    with pytest.raises(AssertionError):
        test_no_import_cycles()
    with pytest.raises(AssertionError):
        test_no_module_imports_from_a_higher_layer()
