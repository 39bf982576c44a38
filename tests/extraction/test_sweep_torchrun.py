"""Sweeps across processes and real signals: torchrun splits the checkpoints (the file equals the one-process file
bit for bit), and a sweep killed by SIGTERM resumes to the uninterrupted file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.extraction.test_distributed import torchrun
from tests.extraction.test_sweep import TEXT, assert_same_file
from tests.series_models import save_revision, tiny_bloom, tiny_neox

_CHECKOUT = Path(__file__).resolve().parents[2]
# this checkout's biasviz (its src first, ahead of any installed copy) and its tests, wherever the command runs
HERE = os.pathsep.join([str(_CHECKOUT / "src"), str(_CHECKOUT)])


@pytest.mark.parametrize(("repo", "summary"), [("EleutherAI/pythia-tiny", False), ("bigscience/bloom-tiny", True)])
def test_two_processes_equal_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                 repo: str, summary: bool) -> None:  # fmt: skip
    cache = tmp_path / "cache"
    for k, step in enumerate([0, 1, 2, 4, 1000]):  # five checkpoints: two for process 0, three for process 1
        make = tiny_bloom if "bloom" in repo else tiny_neox
        save_revision(cache, repo, f"step{step}" if "pythia" in repo else f"global_step{step}", make(k))
    (tmp_path / "text.txt").write_text(TEXT)
    common = ["extract", "--model", repo, "--checkpoints", "all", "--samples", "3", "--seq-len", "16", "--layer",
              "all", "--text", "text.txt", "--quiet", "--device", "cpu",
              *(["--summary"] if summary else [])]  # fmt: skip
    run = torchrun([*common, "--out", "two.h5"], tmp_path, env={"HF_HUB_CACHE": str(cache), "PYTHONPATH": HERE})
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("wrote") == 1 and "2 processes" in run.stdout
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli([*common, "--out", "one.h5"], capsys)
    assert rc == 0, err
    assert_same_file(tmp_path / "one.h5", tmp_path / "two.h5", may_differ={"created_utc", "processes"})
    assert sorted(p.name for p in tmp_path.iterdir() if "partial" in p.name or p.name.startswith(".")) == []


def test_a_killed_sweep_resumes_to_the_uninterrupted_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A real SIGTERM (a scheduler's time limit) to a real process, then --resume."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cache = tmp_path / "cache"
    for k, step in enumerate([0, 1, 2, 4, 8, 16]):
        save_revision(cache, "EleutherAI/pythia-tiny", f"step{step}", tiny_neox(k))
    (tmp_path / "text.txt").write_text(TEXT)
    common = ["extract", "--model", "EleutherAI/pythia-tiny", "--checkpoints", "all", "--samples", "4", "--seq-len",
              "64", "--layer", "all", "--text", "text.txt", "--quiet", "--device", "cpu"]  # fmt: skip
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "PYTHONPATH": HERE}
    proc = subprocess.Popen([sys.executable, "-m", "biasviz", *common, "--out", "cut.h5"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    partial = tmp_path / "cut.h5.partial"
    deadline = time.monotonic() + 120
    while proc.poll() is None and len(list(partial.glob("step-*.h5"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    kept = len(list(partial.glob("step-*.h5")))
    if proc.returncode == 0:  # finished before the signal landed: nothing to resume on this machine
        pytest.skip("the sweep finished before it could be interrupted")
    assert proc.returncode == 130 and f"the {kept} of 6 checkpoints finished are kept in" in err, err
    assert 2 <= kept < 6 and not (tmp_path / "cut.h5").exists()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli([*common, "--out", "cut.h5", "--resume"], capsys)
    assert rc == 0, err
    rc, _, err = run_cli([*common, "--out", "whole.h5"], capsys)
    assert rc == 0, err
    assert_same_file(tmp_path / "whole.h5", tmp_path / "cut.h5", may_differ={"created_utc"})
    assert not partial.exists()
