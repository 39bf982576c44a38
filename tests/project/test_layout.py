"""The package's layout: one package per stage, imports only from stages below, no cycles, small modules.

``STAGES`` is the one place the order is written: a stage may import from itself and from stages before it.
Every import is read from the source (module level and inside functions alike, since a lazy import still
ties two stages together), so the test fails on an upward import or a cycle before anything runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "biasviz"

STAGES = (
    "common",
    "schemes",
    "model",
    "data",
    "training",
    "store",
    "diagnostics",
    "tracing",
    "adapters",
    "summaries",
    "extraction",
    "plotting",
    "explorer",
    "notebook",
    "cli",
)
FRONT_DOOR = {"__init__", "__main__"}  # biasviz/__init__.py and __main__.py sit above every stage
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The biasviz modules ``name`` imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "biasviz")
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, path.name == "__init__.py", node)
            if target.split(".")[0] != "biasviz":
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known)
    return found


def stage_of(module: str) -> str | None:
    """``biasviz.store.writer`` -> ``store``; the front door (``biasviz``, ``biasviz.__main__``) -> None."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in FRONT_DOOR:
        return None
    return parts[1]


def test_every_package_is_a_stage_and_no_module_sits_loose() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    loose = {p.stem for p in ROOT.glob("*.py")} - FRONT_DOOR
    assert not loose, f"modules beside the stages: {sorted(loose)}; give each a stage"
    assert packages <= set(STAGES), f"packages not in STAGES: {sorted(packages - set(STAGES))}"


def test_no_import_runs_up_the_pipeline() -> None:
    modules = _modules()
    rank = {s: i for i, s in enumerate(STAGES)}
    wrong = []
    for name, path in modules.items():
        here = stage_of(name)
        if here is None:
            continue
        for target in imports_of(name, path, set(modules)):
            there = stage_of(target)
            if there is None:
                wrong.append(f"{name} imports the front door {target}")
            elif rank[there] > rank[here]:
                wrong.append(f"{name} ({here}) imports {target} ({there}), a later stage")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {n: {t for t in imports_of(n, p, set(modules)) if t in modules and t != n} for n, p in modules.items()}
    # a package's __init__ importing its own submodules is how packages re-export; a cycle through one is not
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if n.startswith(m + "."):  # a module importing its own package's __init__: the package, not a cycle
                continue
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m) :] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_small(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): split it by job"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The walker itself: a lower stage importing a higher one, in a function body, is found."""
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from biasviz.plotting.heatmap import plot_grid\n    from . import format\n")
    got = imports_of("biasviz.store.x", src, {"biasviz.store.format"})
    assert "biasviz.plotting.heatmap" in got and "biasviz.store.format" in got
    assert STAGES.index(stage_of("biasviz.plotting.heatmap")) > STAGES.index(stage_of("biasviz.store.x"))
