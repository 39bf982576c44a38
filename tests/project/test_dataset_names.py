"""No summary dataset's name is spelled outside the table (``store/datasets.py``): every other module refers to its
constants and helpers (``map_name``, ``profile_name``, ``se_name``), so a dataset is renamed in one place.

The scan reads each module's string literals with :mod:`ast` (comments and docstrings are not literals): a literal
that is a dataset's name, or holds one as a whole word (a message, an HDF5 path such as f"{layer}/sink_keys"; in an
f-string, each constant part), is reported as ``path:line: 'name'``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from biasviz.store import datasets

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "biasviz"
TABLE = PACKAGE / "store" / "datasets.py"
# Plain English words the package also uses with other meanings: "attended" is a stream kind and a bank key of the
# extraction (the cells a call attends) and an attribute of a layer's position summary; "diagnostics" is a row's
# check (records of DIAGNOSTIC_FIELDS), the figure file diagnose writes and a word of its messages. A literal of
# these is reported only where it can be nothing but a dataset's key: a subscript (grp["attended"]) or a membership
# test ("diagnostics" in grp). Where the dataset is meant elsewhere, the code uses ATTENDED and DIAGNOSTICS.
OTHER_MEANINGS = frozenset({datasets.ATTENDED, datasets.DIAGNOSTICS})
# Literals in modules another change is rewriting, (path from the repository root, name): none at present.
KNOWN: frozenset[tuple[str, str]] = frozenset()
_WORD = "A-Za-z0-9_"


def dataset_names() -> frozenset[str]:
    """Every name a summary layer's dataset may have: the table's rows, each quantity's maps and distance profile,
    and the standard error beside each."""
    names = set(datasets.ROWS)
    for kind in datasets.KINDS:
        names |= {datasets.map_name(kind, "mean"), datasets.map_name(kind, "std"), datasets.profile_name(kind)}
    return frozenset(names | {datasets.se_name(name) for name in names})


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _as_key(tree: ast.AST) -> set[int]:
    """The ids of the string literals used as a subscript (x["name"]) or tested for membership ("name" in x)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            found.add(id(node.slice))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            found.add(id(node.left))
    return found


def scan(source: str, names: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(line, name) for each dataset name a string literal of ``source`` spells, in the order they appear."""
    names = frozenset(names)
    plain = sorted(names - OTHER_MEANINGS, key=len, reverse=True)
    word = re.compile(rf"(?<![{_WORD}])({'|'.join(map(re.escape, plain))})(?![{_WORD}])")
    tree = ast.parse(source)
    docs, keys = _docstrings(tree), _as_key(tree)
    literals = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    for node in sorted(literals, key=lambda n: (n.lineno, n.col_offset)):
        if id(node) in docs:
            continue
        if node.value in OTHER_MEANINGS & names:
            if id(node) in keys:
                yield node.lineno, node.value
            continue
        for found in word.finditer(node.value):
            yield node.lineno, found.group(1)


def findings(paths: Iterable[Path], names: Iterable[str], root: Path = REPO) -> list[str]:
    """``path:line: 'name'`` for each dataset name spelled in ``paths``, but for the known exceptions."""
    names = frozenset(names)
    out = []
    for path in paths:
        where = path.relative_to(root).as_posix()
        for line, name in scan(path.read_text(encoding="utf-8"), names):
            if (where, name) not in KNOWN:
                out.append(f"{where}:{line}: {name!r}")
    return out


def test_no_dataset_name_is_spelled_outside_the_table() -> None:
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if p != TABLE]
    found = findings(paths, dataset_names())
    assert not found, "spell these with store/datasets.py's constants and helpers:\n" + "\n".join(found)


def test_the_scan_reports_a_spelled_name(tmp_path: Path) -> None:
    module = tmp_path / "consumer.py"
    module.write_text('"""Reads band_mass (a docstring: not counted)."""\n\n'
                      "# a comment naming band_mass is not counted either\n"
                      'def read(grp, layer):\n    return grp["band_mass"], grp[f"layer_{layer}/sink_keys"]\n\n\n'
                      'def mask(grp):\n    return grp["attended"] if "diagnostics" in grp else "attended"\n',
                      encoding="utf-8")  # fmt: skip
    assert findings([module], dataset_names(), root=tmp_path) == [
        "consumer.py:5: 'band_mass'", "consumer.py:5: 'sink_keys'", "consumer.py:9: 'attended'",
        "consumer.py:9: 'diagnostics'"]  # fmt: skip


def test_the_names_scanned_are_the_tables() -> None:
    names = dataset_names()
    assert {"band_mass", "bias_std", "weights_profile_se", "sink_keys_of_mean", "attending_samples"} <= names
    assert set(datasets.ROWS) <= names and not any(name.startswith("layer_") for name in names)
