"""Two processes, one output: one wins, the other fails at once and clearly; neither deletes the other's work.

A child process holds an output's lock (as a running ``extract`` or ``train`` does) beside a temporary file
of its own; every command aimed at that output must fail with one ``Error:`` line and leave both alone.
Temporary files of runs that were killed (their process gone) are removed by the next run to that output.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import h5py
import pytest

from tests.conftest import run_cli
from tests.hostile import make_assets

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from biasviz.common.atomic import temporary_name
    from biasviz.common.exclusive import writing_alone
    target = Path(sys.argv[1])
    with writing_alone(target):
        temporary_name(target).write_text("the other run's work")
        print("holding", flush=True)
        time.sleep(120)
""")

EX = "extract --model {alibi} --text {text} --seq-len 8 --samples 1 --quiet"
TRAIN = "train --scheme alibi --steps 1 --seq-len 8 --batch-size 1 --corpus {text} --device cpu --quiet"
#: (name, command line with {out} the contested output, which output: a file or a folder)
CONTESTED = [
    ("extract", EX + " --out {out}", "x.h5"),
    ("extract --force", EX + " --out {out} --force", "x.h5"),
    ("extract over an existing file, --force", EX + " --out {out} --force", "old.h5"),
    ("extract --summary", EX + " --summary --out {out} --force", "x.h5"),
    ("extract --bias-only", "extract --model {alibi} --bias-only --seq-len 8 --quiet --out {out} --force", "x.h5"),
    ("extract --bias-only --resolution", "extract --model {alibi} --bias-only --seq-len 8 --resolution 4 --quiet "
     "--out {out} --force", "x.h5"),
    ("train", TRAIN + " --out {out}", "ck"),
    ("train --force over a checkpoint", TRAIN + " --out {out} --force", "old_ck"),
    ("extract to the default output", EX.replace("{alibi}", "{alibi}") + " --force", "data/alibi.h5"),
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_assets(tmp_path_factory.mktemp("concurrent"))


def held(target: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("name", "argv", "output"), CONTESTED, ids=[c[0] for c in CONTESTED])
def test_a_second_writer_fails_at_once(assets: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch, name: str, argv: str, output: str) -> None:
    monkeypatch.chdir(tmp_path)
    target = tmp_path / output
    target.parent.mkdir(parents=True, exist_ok=True)
    if output == "old.h5":
        target.write_bytes(Path(assets["good"]).read_bytes())
    if output == "old_ck":
        run_cli([*TRAIN.format(**assets).split(), "--out", str(target)], capsys)
    for _ in held(target):
        before = files_under(tmp_path)
        code, _, err = run_cli(argv.format(out=target, **assets).split(), capsys)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and len(lines) == 1, (name, code, err)
        said = lines[0].removeprefix("Error: another biasviz process is writing ")
        assert said.endswith("; wait for it to finish or choose another --out"), lines[0]
        assert (tmp_path / said.split(";")[0]).resolve() == target.resolve(), lines[0]
        assert files_under(tmp_path) == before, "the other run's work changed"


def test_two_real_runs_one_output(assets: dict[str, str], tmp_path: Path) -> None:
    """Two extract processes started together: every one that fails says why; the file is whole; no temporaries."""
    out = tmp_path / "x.h5"
    argv = [str(Path(sys.executable).with_name("biasviz")), *EX.format(**assets).split(), "--samples", "24",
            "--seq-len", "64", "--out", str(out), "--force"]  # fmt: skip
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    assert any(code == 0 for code, _ in results), results
    for code, err in results:
        assert code == 0 or "another biasviz process is writing" in err, err
    with h5py.File(out) as f:
        assert f["input_ids"].shape == (24, 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.h5"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("kind", ["extract", "extract --summary", "train"])
def test_temporaries_of_killed_runs_are_removed_by_the_next(assets: dict[str, str], tmp_path: Path, kind: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from biasviz.common.atomic import temporary_prefix

    target = tmp_path / ("ck" if kind == "train" else "x.h5")
    prefix = temporary_prefix(target)
    dead = tmp_path / f"{prefix}{_dead_pid()}.tmp"
    if kind == "train":  # a killed train leaves a folder
        dead.mkdir()
        (dead / "model.safetensors").write_bytes(b"\0" * 64)
    else:
        dead.write_bytes(b"\0" * 64)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f"{prefix}{alive.pid}.tmp"  # a run still going (not holding the lock: kept anyway)
        live.write_text("still writing")
        other = tmp_path / f".y.h5.{_dead_pid()}.tmp"  # another output's: not this run's business
        other.write_text("x")
        argv = (TRAIN if kind == "train" else EX + (" --summary" if "summary" in kind else "")).format(**assets)
        code, _, err = run_cli([*argv.split(), "--out", str(target)], capsys)
        assert code == 0, err
        assert not dead.exists() and live.exists() and other.exists()
    finally:
        alive.kill()
        alive.wait()


def test_a_killed_run_does_not_block_the_next(assets: dict[str, str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    target = tmp_path / "x.h5"
    for proc in held(target):
        proc.kill()  # SIGKILL: no handler runs, the lock file stays behind
        proc.wait()
    code, _, err = run_cli([*EX.format(**assets).split(), "--out", str(target)], capsys)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.h5"]  # its temporary and lock file are gone


def test_table_size() -> None:
    assert len(CONTESTED) >= 8


def test_an_output_in_a_new_folder(assets: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lock lives beside the output: its folder is made first, as the writer would make it."""
    for argv, out in ((EX, tmp_path / "new" / "deeper" / "x.h5"), (TRAIN, tmp_path / "runs" / "ck")):
        code, _, err = run_cli([*argv.format(**assets).split(), "--out", str(out)], capsys)
        assert code == 0, err
        assert out.exists() and sorted(p.name for p in out.parent.iterdir()) == [out.name]


@pytest.mark.parametrize("kind", ["plot", "explore", "diagnose"])
def test_every_command_removes_temporaries_of_killed_runs(assets: dict[str, str], tmp_path: Path, kind: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from biasviz.common.atomic import temporary_prefix

    out = tmp_path / "figs"
    out.mkdir()
    target = {"plot": out / "alibi_bias.png", "explore": out / "page.html", "diagnose": out / "d.json"}[kind]
    dead = out / f"{temporary_prefix(target)}{_dead_pid()}.tmp"
    dead.write_bytes(b"\0" * 64)
    argv = {"plot": ["plot", "--scheme", "alibi", "--input", assets["good"], "--format", "png", "--out-dir", str(out)],
            "explore": ["explore", assets["good"], "--out", str(target)],
            "diagnose": ["diagnose", assets["good"], "--json", str(target), "--no-figures"]}[kind]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert target.exists() and not dead.exists()
