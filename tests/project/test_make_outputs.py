"""What ``make figures`` built is never quietly replaced, and is rebuilt when something else replaced it.

The shell examples of README and the site's pages are read command by command: none may write where
``make figures`` writes unless it refuses to replace an existing file (no ``--force``). The manifest that
``make figures`` keeps dates back every target one of whose files changed content, so ``make`` rebuilds it,
and lets ``make clean`` remove exactly the files the build wrote (the manifest's own tests:
tests/cli/test_manifest.py).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from biasviz.common.written import LOG_ENV, TARGET_ENV
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
        return [f"{out_dir}/{scheme}_{k}.{ext}" for k in kinds for ext in ("pdf", "png")], force
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


def _built(path: Path, content: bytes, target: Path, monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    """Write ``path`` as a step of ``make figures`` does: through biasviz's writer, with the build's log set."""
    from biasviz.common.atomic import replacing

    path.parent.mkdir(parents=True, exist_ok=True)
    with monkeypatch.context() as m:
        m.setenv(LOG_ENV, str(log))
        m.setenv(TARGET_ENV, str(target))
        with replacing(path) as tmp:
            tmp.write_bytes(content)


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


def test_make_clean_removes_what_make_figures_wrote_and_never_a_users_own_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The build's files go, by their recorded content; a user's ``plot --kind profile`` output, a file made by
    hand and a build's figure the user replaced since all stay, whatever their names look like."""
    from tests.cli.test_plot_cmd import _alibi, write_file
    from tests.conftest import run_cli

    runs, data, figures = tmp_path / "runs", tmp_path / "data", tmp_path / "figures"
    log = runs / "stages" / "written.log"
    for name, target in [("runs/alibi/model.safetensors", "runs/alibi/model.safetensors"),
                         ("runs/alibi/checkpoint-100/model.safetensors", "runs/alibi/model.safetensors"),
                         ("runs/rope/config.json", "runs/rope/model.safetensors"),
                         ("data/alibi-long.h5", "data/alibi-long.h5"),
                         ("figures/diagnostics.json", "figures/diagnostics.pdf"),
                         ("figures/positional.png", "figures/positional.pdf"),
                         ("figures/position_measures.tex", "figures/position_measures.pdf"),
                         ("figures/cable_explore.html", "figures/cable_explore.html")]:  # fmt: skip
        _built(tmp_path / name, name.encode(), tmp_path / target, monkeypatch, log)
    source = write_file(data / "alibi.h5", "alibi", _alibi(2))
    _built(source, source.read_bytes(), source, monkeypatch, log)
    with monkeypatch.context() as m:  # the Makefile's own plot step, logged
        m.setenv(LOG_ENV, str(log))
        m.setenv(TARGET_ENV, str(figures / "alibi_bias.pdf"))
        code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(source), "--kind", "all", "--out-dir",
                                str(figures)], capsys)  # fmt: skip
        assert code == 0, err
    code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(source), "--kind", "profile", "--out-dir",
                            str(figures)], capsys)  # the user's own, beside the build's  # fmt: skip
    assert code == 0, err
    users = sorted(p.name for p in figures.glob("alibi_*_profile.*"))
    assert users == ["alibi_bias_profile.pdf", "alibi_bias_profile.png", "alibi_weights_profile.pdf",
                     "alibi_weights_profile.png"]  # fmt: skip
    mine = ["runs/mine/model.safetensors", "runs/mine/checkpoint-5/model.safetensors", "data/mine.h5",
            "data/mine/part.h5", "figures/mine_bias.pdf", "figures/notes.txt", "figures/t5_profile.pdf"]  # fmt: skip
    for name in mine:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    (runs / "stages").mkdir(parents=True, exist_ok=True)
    (runs / "stages" / "alibi.plot.json").write_text("{}")  # a stage file of make's own
    _make("record-built", tmp_path)  # what every `make figures` ends with
    (figures / "diagnostics.json").write_text("{}")  # the build's file, replaced by the user since: theirs now
    _make("clean", tmp_path)
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted([*mine, *(f"figures/{n}" for n in users), "figures/diagnostics.json"])
    assert not (tmp_path / "runs/alibi").exists() and not (tmp_path / "runs/stages").exists()


def test_every_file_make_figures_writes_is_ignored_by_git() -> None:
    """After ``make figures`` the tree is clean: nothing it writes shows as a new file."""
    import subprocess

    paths = sorted(made_by_make())
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert sorted(done.stdout.split()) == paths


def test_every_step_of_make_figures_logs_what_it_writes(tmp_path: Path) -> None:
    """Each command of the build that writes into runs/, data/ or figures/ runs with the build's log set, so
    that ``make clean`` knows its files by content, not by name."""
    import subprocess

    folders = [f"RUNS={tmp_path / 'runs'}", f"DATA={tmp_path / 'data'}", f"FIGURES={tmp_path / 'figures'}"]
    done = subprocess.run(["make", "-n", "--no-print-directory", "figure-files", *folders], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if re.search(r"biasviz (train|extract|plot|explore|diagnose)|"
                                                                    r"biasviz\.plotting\.", line)]  # fmt: skip
    assert len(steps) >= 30
    for line in steps:
        assert f"BIASVIZ_WRITTEN_LOG={tmp_path / 'runs'}/stages/written.log" in line, line
        assert "BIASVIZ_WRITTEN_FOR=" + str(tmp_path) in line, line


def test_the_long_steps_of_make_figures_print_their_progress(tmp_path: Path) -> None:
    """Training and the long extracts run for minutes: none of them is silenced with --quiet, so each prints a line
    when it starts and at every tenth of its work (``biasviz.common.progress``)."""
    import subprocess

    folders = [f"RUNS={tmp_path / 'runs'}", f"DATA={tmp_path / 'data'}", f"FIGURES={tmp_path / 'figures'}"]
    done = subprocess.run(["make", "-n", "--no-print-directory", "figure-files", *folders], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    long_steps = [line for line in done.stdout.splitlines() if re.search(r"biasviz (train|extract) ", line)]
    assert sum("--summary" in line for line in long_steps) >= 2 * len(POSITIONAL) + len(LONG)
    assert sum(" train " in line for line in long_steps) == len(POSITIONAL)
    assert not [line for line in long_steps if "--quiet" in line]


@pytest.mark.parametrize("jobs", [1, 2])
def test_make_figures_runs_steps_side_by_side_each_naming_its_file(tmp_path: Path, jobs: int) -> None:
    """JOBS steps at a time on THREADS torch threads each (2 cores: 2 and 1); while more than one runs, progress
    comes as lines (bars would share one terminal line), each step's naming the file or run it makes."""
    import subprocess

    folders = [f"RUNS={tmp_path / 'runs'}", f"DATA={tmp_path / 'data'}", f"FIGURES={tmp_path / 'figures'}"]
    done = subprocess.run(["make", "-n", "--no-print-directory", "figures", f"JOBS={jobs}", "THREADS=1", *folders],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"-j{jobs} figure-files" in done.stdout
    assert ("BIASVIZ_PROGRESS=lines" in done.stdout) == (jobs > 1)
    assert "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}" in done.stdout  # the user's own value wins
    trains = [line for line in done.stdout.splitlines() if re.search(r"biasviz train ", line)]
    assert len(trains) == len(POSITIONAL)
    for line in trains:
        run = re.search(r"--out (\S+)", line).group(1)
        assert f"BIASVIZ_PROGRESS_FOR={run} " in line, line
