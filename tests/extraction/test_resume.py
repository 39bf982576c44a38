"""Resuming a checkpoint sweep (biasviz.extraction.resume): an interrupted sweep keeps its finished checkpoints,
``--resume`` continues only the same sweep, and the resumed file equals an uninterrupted one bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.extraction.sweep import extract_sweep
from tests.conftest import run_cli
from tests.extraction import test_hub
from tests.extraction.test_sweep import assert_same_file
from tests.series_models import VOCAB

hub = test_hub.hub  # the hub cache of test_hub.py, a fixture of this file's own


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, module: str, name: str, calls: int) -> None:
    """Make the per-checkpoint extraction raise KeyboardInterrupt (a Ctrl-C) once ``calls`` have finished."""
    import importlib

    mod = importlib.import_module(module)
    real, count = getattr(mod, name), [0]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if count[0] == calls:
            raise KeyboardInterrupt
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, name, interrupted)



@pytest.mark.parametrize("summary", [False, True])
def test_a_resumed_sweep_equals_an_uninterrupted_one_bit_for_bit(
    hub: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, summary: bool
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    windows = np.random.default_rng(3).integers(0, VOCAB, size=(3, 12))
    options = {"layers": "all", "device": "cpu", "progress": False, "summary": summary}
    whole, out = tmp_path / "whole.h5", tmp_path / "resumed.h5"
    extract_sweep("EleutherAI/pythia-tiny", "all", windows, whole, **options)
    with monkeypatch.context() as m:
        _interrupt_after(m, "biasviz.extraction.summary" if summary else "biasviz.extraction.run",
                         "extract_summary" if summary else "extract", 3)  # fmt: skip
        with pytest.raises(KeyboardInterrupt, match="the 3 of 7 checkpoints finished are kept in .*--resume"):
            extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, **options)
    partial = tmp_path / "resumed.h5.partial"
    assert not out.exists() and sorted(p.name for p in partial.glob("step-*.h5")) == [
        "step-0.h5", "step-1.h5", "step-2.h5"]  # fmt: skip
    with pytest.raises(BiasvizError, match="holds an unfinished sweep .3 checkpoints done.; add --resume"):
        extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, **options)
    with pytest.raises(BiasvizError, match="--resume: .* was started with other settings .windows.sha256"):
        extract_sweep("EleutherAI/pythia-tiny", "all", windows[:, ::-1].copy(), out, resume=True, **options)
    with pytest.raises(BiasvizError, match="--resume: .* other settings .checkpoints was"):
        extract_sweep("EleutherAI/pythia-tiny", "first,last", windows, out, resume=True, **options)
    import biasviz.adapters as adapters

    # a finished part cut short (a disk that filled, a copy that stopped): one error naming it and the ways out
    damaged = partial / "step-1.h5"
    kept = damaged.read_bytes()
    damaged.write_bytes(kept[: len(kept) // 2])
    with pytest.raises(BiasvizError, match=r"--resume: checkpoint step1, finished by an earlier run, cannot be read "
                       r"from .*step-1\.h5 .*delete that file .*--resume .*--force") as err:  # fmt: skip
        extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, resume=True, **options)
    assert "\n" not in str(err.value)
    damaged.unlink()
    calls: list[Path] = []
    real_load = adapters.load_model
    monkeypatch.setattr(adapters, "load_model", lambda p, *a, **k: calls.append(Path(p)) or real_load(p, *a, **k))
    extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, resume=True, **options)
    assert len(calls) == 5  # only the checkpoints missing were run: the four never run and the one deleted
    assert not partial.exists()
    assert_same_file(whole, out, may_differ={"created_utc"})



def test_resume_needs_an_unfinished_sweep(hub: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.chdir(hub["root"])
    base = ["extract", "--model", "EleutherAI/pythia-tiny", "--samples", "2", "--seq-len", "16", "--text", "text.txt"]
    rc, _, err = run_cli([*base, "--checkpoints", "all", "--resume", "--out", str(tmp_path / "r.h5")], capsys)
    assert rc == 1 and "no unfinished sweep" in err
    rc, _, err = run_cli([*base, "--resume", "--out", str(tmp_path / "r.h5")], capsys)
    assert rc == 2 and "--resume applies with --checkpoints" in err
