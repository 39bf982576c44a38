"""torchrun splits a sweep's checkpoints across processes: the file equals the one-process file bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.series_models import save_revision, tiny_bloom, tiny_neox
from tests.test_checkpoint_series import TEXT, assert_same_file
from tests.test_distributed import torchrun


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
    here = str(Path(__file__).resolve().parents[1])  # this checkout's biasviz, wherever the command runs
    run = torchrun([*common, "--out", "two.h5"], tmp_path, env={"HF_HUB_CACHE": str(cache), "PYTHONPATH": here})
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("wrote") == 1 and "2 processes" in run.stdout
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli([*common, "--out", "one.h5"], capsys)
    assert rc == 0, err
    assert_same_file(tmp_path / "one.h5", tmp_path / "two.h5", may_differ={"created_utc", "processes"})
    assert sorted(p.name for p in tmp_path.iterdir() if "partial" in p.name or p.name.startswith(".")) == []
