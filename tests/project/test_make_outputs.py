"""What ``make figures`` built is never quietly replaced, and is rebuilt when something else replaced it.

The shell examples of README and the site's pages are read command by command: none may write where
``make figures`` writes unless it refuses to replace an existing file (no ``--force``; ``plot`` has none and
always replaces, so it must name another ``--out-dir``). The manifest that ``make figures`` keeps dates back
every target one of whose files changed content, so ``make`` rebuilds it.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from biasviz.cli.manifest import record, stale, target_of
from tests.docs_pages import blocks

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()
SCHEMES = re.search(r"^SCHEMES := (.+)$", MAKEFILE, re.M).group(1).split()
DYNAMICS = re.search(r"^DYNAMICS := (.+)$", MAKEFILE, re.M).group(1).strip()
LONG = re.search(r"^LONG\s+:= (.+)$", MAKEFILE, re.M).group(1).split()
POSITIONAL = [*SCHEMES, *re.search(r"^POSITIONAL := \$\(SCHEMES\) (.+)$", MAKEFILE, re.M).group(1).split()]


def made_by_make() -> set[str]:
    """Every path ``make figures`` writes (data, runs and the figures folder's own files)."""
    paths = {"figures/diagnostics.json", "figures/long_context.pdf", "figures/long_context.png"}
    for s in SCHEMES:
        paths |= {f"data/{s}.h5", f"runs/{s}", f"figures/{s}_explore.html"}
        paths |= {f"figures/{s}_{k}.{ext}" for k in ("bias", "weights", "profile") for ext in ("pdf", "png")}
    paths |= {f"data/{DYNAMICS}-sweep.h5", f"figures/{DYNAMICS}_dynamics.pdf", f"figures/{DYNAMICS}_dynamics.png",
              f"figures/{DYNAMICS}_training.pdf", f"figures/{DYNAMICS}_training.png"}  # fmt: skip
    paths |= {f"data/{s}-long.h5" for s in LONG}
    for s in POSITIONAL:
        paths |= {f"runs/{s}", f"data/{s}-pos-short.h5", f"data/{s}-pos-long.h5"}
    paths |= {"figures/positional.pdf", "figures/positional.png", "figures/position_measures.pdf",
              "figures/position_measures.png", "figures/position_measures.tex"}
    return paths | {"figures/diagnostics.pdf", "figures/diagnostics.png"}


def readme_commands() -> list[list[str]]:
    commands = []
    for _, block in blocks("bash"):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith(("biasviz ", "torchrun ")) and "..." not in line and "[" not in line:
                commands.append(shlex.split(line))
    return commands


def writes(argv: list[str]) -> tuple[list[str], bool]:
    """The paths a README command writes (as ``figures/NAME`` etc.) and whether it replaces existing ones."""
    args = argv[argv.index("biasviz") + 1 :] if "biasviz" in argv else argv[argv.index("-m") + 2 :]
    command, opts = args[0], args[1:]

    def opt(name: str, default: str | None = None) -> str | None:
        return opts[opts.index(name) + 1] if name in opts else default

    force = "--force" in opts
    if command == "plot":
        out_dir = opt("--out-dir", "figures")
        scheme = opt("--scheme")
        kind = opt("--kind", "bias")
        kinds = {"all": ["bias", "weights"], "std": ["bias", "weights"]}.get(kind, [kind])
        return [f"{out_dir}/{scheme}_{k}.{ext}" for k in kinds for ext in ("pdf", "png")], True
    if command == "diagnose":
        out_dir = opt("--out-dir", "figures")
        return [opt("--json", f"{out_dir}/diagnostics.json"), f"{out_dir}/diagnostics.pdf"], force
    if command in ("extract", "train", "explore"):
        out = opt("--out")
        return ([out] if out else []), force
    return [], False


COMMANDS = readme_commands()


def test_the_readme_has_commands_to_check() -> None:
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("argv", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_a_readme_example_never_quietly_replaces_what_make_built(argv: list[str]) -> None:
    paths, replaces = writes(argv)
    if replaces:
        clash = sorted(set(paths) & made_by_make())
        assert not clash, f"{' '.join(argv)} replaces {clash}, which make figures built"


def test_the_manifest_rebuilds_a_replaced_figure_set(tmp_path: Path) -> None:
    runs, data, figures = tmp_path / "runs", tmp_path / "data", tmp_path / "figures"
    files = {runs / "alibi" / "model.safetensors": b"w", runs / "alibi" / "checkpoint-100" / "model.safetensors": b"c",
             data / "alibi.h5": b"d", figures / "alibi_bias.pdf": b"p", figures / "alibi_weights.png": b"q",
             figures / "alibi_profile.pdf": b"r", figures / "diagnostics.pdf": b"s",
             figures / "alibi_explore.html": b"h", runs / "stages" / "alibi.plot.json": b"{}"}  # fmt: skip
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    manifest = runs / "stages" / "built.json"
    assert record(manifest, runs, data, figures) == len(files) - 1  # stage files are make's own
    assert stale(manifest) == []
    (figures / "alibi_weights.png").write_bytes(b"an example's figure")  # same name, other content
    (figures / "alibi_profile.pdf").unlink()
    (runs / "alibi" / "checkpoint-100" / "model.safetensors").write_bytes(b"other")
    got = stale(manifest)
    assert sorted(got) == sorted([figures / "alibi_bias.pdf", figures / "diagnostics.pdf",
                                  runs / "alibi" / "model.safetensors"])  # fmt: skip
    assert all(os.stat(p).st_mtime == 0 for p in got)
    assert os.stat(data / "alibi.h5").st_mtime > 0 and os.stat(figures / "alibi_explore.html").st_mtime > 0


@pytest.mark.parametrize(("name", "target"), [
    ("runs/fire/training.json", "runs/fire/model.safetensors"), ("data/fire.h5", "data/fire.h5"),
    ("figures/fire_weights.svg", "figures/fire_bias.pdf"), ("figures/kerple-log_dynamics.png",
                                                            "figures/kerple-log_dynamics.pdf"),
    ("figures/long_context.png", "figures/long_context.pdf"), ("figures/t5_profile.png", "figures/diagnostics.pdf"),
    ("figures/diagnostics.json", "figures/diagnostics.pdf"),
    ("figures/position_measures.png", "figures/position_measures.pdf"),
    ("figures/position_measures.tex", "figures/position_measures.pdf"),
    ("figures/cable_explore.html", "figures/cable_explore.html"),
])  # fmt: skip
def test_every_file_maps_to_the_make_target_that_writes_it(name: str, target: str) -> None:
    assert target_of(Path(name), Path("runs"), Path("figures")) == Path(target)
    name = Path(target).name
    rules = {f"$(FIGURES)/{name}:", f"$(FIGURES)/{re.sub(r'^[a-z-]+_', '%_', name)}:", f"$(RUNS)/%/{name}:",
             f"$(DATA)/%{Path(target).suffix}:"}  # the rule for this target, by name or by pattern
    assert any(line.startswith(tuple(rules)) for line in MAKEFILE.splitlines()), rules


def _make(target: str, root: Path, makefile: Path = ROOT / "Makefile") -> None:
    """Run one target of the Makefile on folders under ``root`` (the venv this test runs in as its .venv)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    folders = [f"RUNS={root / 'runs'}", f"DATA={root / 'data'}", f"FIGURES={root / 'figures'}",
               f"BIN={Path(sys.executable).parent}"]  # fmt: skip
    done = subprocess.run(["make", "--no-print-directory", "-f", str(makefile), target, *folders], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_make_clean_removes_what_make_figures_made_and_never_a_users_own_files(tmp_path: Path) -> None:
    import json

    built = ["runs/alibi/model.safetensors", "runs/alibi/checkpoint-100/model.safetensors", "runs/rope/config.json",
             "data/alibi.h5", "data/alibi-long.h5", "figures/alibi_bias.pdf", "figures/alibi_weights.png",
             "figures/diagnostics.json", "figures/positional.png", "figures/cable_explore.html"]  # fmt: skip
    mine = ["runs/mine/model.safetensors", "runs/mine/checkpoint-5/model.safetensors", "data/mine.h5",
            "data/mine/part.h5", "figures/mine_bias.pdf", "figures/notes.txt"]  # fmt: skip
    for name in [*built, *mine, "runs/stages/alibi.plot.json"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    _make("record-built", tmp_path)  # what a `make figures` that had nothing to build ends with
    doc = json.loads((tmp_path / "runs/stages/built.json").read_text())
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in doc["files"]) == sorted(built)
    _make("clean", tmp_path)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(mine)
    assert not (tmp_path / "runs/alibi").exists() and not (tmp_path / "runs/stages").exists()
