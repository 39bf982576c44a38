"""Tests mirror modules (docs/development.md, 'Tests and benchmarks'): a test file in ``tests/<package>/`` is named
``test_<module>.py`` or ``test_<module>_<topic>.py``, ``<module>`` the stem of a module of ``src/biasviz/<package>/``
(the longest that matches; ``<package>`` itself stands for its ``__init__.py``), so that
``ls tests/<package>/test_<module>*`` lists every file that tests that module. Files that test a stage from outside
keep their names only when ALLOWED below says why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "biasviz"
TESTS = ROOT / "tests"

# tests/<package>/ files named for no module: each tests its stage from outside, as a hostile caller would
ALLOWED = {
    "adapters/test_hostile_inputs.py": "hostile input: token ids and configs a library would answer with a traceback",
    "adapters/test_hostile_safetensors.py": "hostile input: safetensors headers that do not add up",
    "adapters/test_hostile_side_files.py": "hostile input: a checkpoint's side files as FIFOs, links and huge files",
    "adapters/test_hostile_state_dicts.py": "hostile input: state dicts whose tensors do not hold what they declare",
    "adapters/test_hostile_usercode.py": "hostile input: user code that exits, raises or fails in its forward",
    "cli/test_hostile_config.py": "hostile input: a config that spells one option twice, through every command",
    "cli/test_hostile_environment.py": "hostile input: bad settings from the environment and deep config files",
    "cli/test_hostile_signals.py": "hostile input: every signal that ends a run, sent to real subprocesses",
    "common/test_hostile_bytes.py": "hostile input: names that are not UTF-8, through every command",
    "common/test_hostile_children.py": "hostile input: the user's modules and PYTHON* variables beside child processes",
    "common/test_hostile_concurrent.py": "hostile input: two processes writing one output",
    "common/test_hostile_names.py": "hostile input: names at the file system's limits, through every command",
    "common/test_hostile_outputs.py": "hostile input: an output naming an input, for every command and every input",
    "common/test_hostile_terminal.py": "hostile input: escape sequences in files' text, as every command prints it",
    "data/test_hostile_tokenizer.py": "hostile input: a tokenizer.json the Rust library panics on",
    "explorer/test_hostile_page.py": "hostile input: everything a page shows from outside, in a real browser",
    "extraction/test_hostile_sizes.py": "hostile input: work too large to fit, refused before it starts",
    "store/test_hostile_declared.py": "hostile input: small files that declare huge datasets",
    "store/test_hostile_in_use.py": "hostile input: a file another process holds open for writing",
    "store/test_hostile_measures.py": "hostile input: crafted numbers in every dataset of the measures' table",
    "store/test_hostile_summary_layout.py": "hostile input: summary layouts the format rules out",
    "training/test_hostile_sweeps.py": "hostile input: checkpoints that do not belong to one series",
}


def modules(package: str) -> set[str]:
    """The stems a test file of ``tests/<package>/`` may be named for: the package's modules and subpackages, and the
    package itself (its ``__init__.py``)."""
    folder = SRC / package
    stems = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    stems |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    return stems | {package.rpartition("/")[2]}


def named_for(name: str, package: str) -> str | None:
    """The module ``tests/<package>/<name>`` is named for (the longest stem that matches), or None."""
    rest = name.removeprefix("test_").removesuffix(".py")
    matches = [m for m in modules(package) if rest == m or rest.startswith(f"{m}_")]
    return max(matches, key=len, default=None)


def packages() -> list[str]:
    """Every package of src/biasviz, a subpackage as its path (``summaries/kernels``)."""
    return sorted(p.parent.relative_to(SRC).as_posix() for p in SRC.rglob("__init__.py") if p.parent != SRC)


def package_test_files() -> list[str]:
    """Every test file of a package's folder, as ``<package>/<name>``."""
    return [f"{package}/{p.name}" for package in packages() for p in sorted((TESTS / package).glob("test_*.py"))]


def imported(path: Path, package: str) -> list[str]:
    """The modules of ``biasviz.<package>`` a test file imports from (the names it could be given), in order."""
    if not path.is_file():
        return []
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"biasviz.{package}"):
            parts = node.module.split(".")
            found.append(parts[2] if len(parts) > 2 else package)
    return list(dict.fromkeys(found))


def problems(files: list[str]) -> list[str]:
    """A line for each file named for no module and not in ALLOWED, with the names it could have."""
    lines = []
    for file in files:
        package, name = file.rsplit("/", 1)
        if file in ALLOWED or named_for(name, package):
            continue
        could = imported(TESTS / file, package) or sorted(modules(package))
        lines.append(f"tests/{file} is named for no module of src/biasviz/{package}/: name it test_<module>.py or "
                     f"test_<module>_<topic>.py, <module> one of {', '.join(could)} (or allow it in ALLOWED, "
                     "saying why)")
    return lines


def test_every_test_file_is_named_for_the_module_it_tests() -> None:
    assert package_test_files(), "no test files found under tests/<package>/"
    assert not problems(package_test_files()), "\n".join(problems(package_test_files()))


def test_every_test_folder_but_project_mirrors_a_package() -> None:
    """A subpackage's tests in a folder of its own (tests/summaries/kernels/), as deep as the package."""
    folders = {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*") if p.is_dir()
               and not any(part.startswith((".", "_")) for part in p.relative_to(TESTS).parts)}  # fmt: skip
    assert folders - {"project"} == set(packages()), "tests/ has a folder for each package of src/biasviz, no more"


def test_every_allowed_file_exists() -> None:
    """The allowlist names files that are there, so that it does not outlive them."""
    missing = [file for file in ALLOWED if not (TESTS / file).is_file()]
    assert not missing, f"ALLOWED names files that are gone: {missing}"


@pytest.mark.parametrize(("file", "module"), [
    ("summaries/test_reducers.py", "reducers"),
    ("summaries/test_fused_layer_traced.py", "fused_layer"),  # the longest stem that matches, not a shorter one
    ("summaries/test_kernels_accumulators.py", "kernels"),  # a subpackage
    ("summaries/test_summaries_made_up_topic.py", "summaries"),  # the package: its __init__.py
    ("summaries/test_positional.py", None),  # positional_blocks etc. are modules; positional alone is not
    ("cli/test_made_up_name.py", None),
    ("summaries/kernels/test_triton_tiles.py", "triton_tiles"),  # a subpackage's module, in its own folder
    ("summaries/kernels/test_kernels_made_up_topic.py", "kernels"),
])  # fmt: skip
def test_a_name_is_for_the_module_it_starts_with(file: str, module: str | None) -> None:
    package, name = file.rsplit("/", 1)
    assert named_for(name, package) == module


def test_a_file_named_for_no_module_is_reported_with_the_names_it_could_have() -> None:
    (line,) = problems(["summaries/test_made_up_engine.py"])
    assert line.startswith("tests/summaries/test_made_up_engine.py is named for no module of src/biasviz/summaries/")
    assert "reducers" in line and "fused_layer" in line  # a file that is not there could be named for any module
    (line,) = problems(["summaries/test_made_up_engine.py", *package_test_files()])


def names_to_test(package: str) -> set[str]:
    """What a module of ``package`` may be: its modules, subpackages, and the package itself where its ``__init__.py``
    holds code of its own (a function or class; not only imports, nor only a ``__getattr__`` that imports lazily)."""
    folder = SRC / package
    names = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    body = ast.parse((folder / "__init__.py").read_text(encoding="utf-8")).body
    if any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name not in ("__getattr__", "__dir__")
           for node in body):
        names.add(package.rpartition("/")[2])
    return names


def untested() -> list[str]:
    """Every module of src/biasviz no test file is named for (a subpackage's ``__init__.py`` tested from its parent's
    folder counts: tests/summaries/test_kernels*.py for summaries/kernels/__init__.py)."""
    missing = []
    for package in packages():
        named = {named_for(p.name, package) for p in (TESTS / package).glob("test_*.py")}
        parent, _, own = package.rpartition("/")
        if parent and any(named_for(p.name, parent) == own for p in (TESTS / parent).glob("test_*.py")):
            named.add(own)
        missing += [f"src/biasviz/{package}/{name}" for name in sorted(names_to_test(package) - named)]
    return missing


def test_every_module_has_a_test_file_named_for_it() -> None:
    """``ls tests/<package>/test_<module>*`` lists a module's tests: for every module there is one to list."""
    assert not untested(), "modules no test file is named for: " + ", ".join(untested())


def test_the_heavy_files_handed_out_first_are_there() -> None:
    """tests/conftest.py's HEAVY_FILES orders the files xdist hands out: a name that moved would silently hand the
    file out late."""
    from tests.conftest import HEAVY_FILES

    assert not [name for name in HEAVY_FILES if not (TESTS / name).is_file()]
