"""Summaries of models whose rows are formed again (biasviz.extraction.replayed): the batches the forward runs in
change no number, and each phase has a progress line of its own (a heartbeat in a log; none with --quiet)."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz.common.progress as progress_module
from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.summary import extract_summary
from tests.conftest import run_cli, small_model
from tests.summaries.test_replay_engine import _windows

TEXT = "def f(x):\n    return x * 2  # a line of code\n" * 200


def test_the_number_of_batches_does_not_change_a_summary(tmp_path: Path) -> None:
    ids = _windows(6, seed=5)
    adapter = BiasGPTAdapter(small_model("cable"), source="test")
    for batch in (1, 4, 6):
        extract_summary(adapter, ids, tmp_path / f"{batch}.h5", resolution=10, batch_size=batch, device="cpu",
                        progress=False)  # fmt: skip
    with h5py.File(tmp_path / "1.h5") as one:
        for batch in (4, 6):
            with h5py.File(tmp_path / f"{batch}.h5") as other:
                for name in ("weights_mean", "weights_std", "bias_mean", "bias_std", "weights_profile"):
                    np.testing.assert_allclose(other[f"layer_1/{name}"][()], one[f"layer_1/{name}"][()], rtol=1e-6,
                                               atol=1e-7, equal_nan=True)  # fmt: skip



def test_progress_in_a_log_is_a_heartbeat_line_in_blocks_and_quiet_silences_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """stderr not a terminal (a log, CI, Slurm): plain lines with the count, rate and time left; --quiet: none."""
    small_model("alibi", vocab_size=300).save_pretrained(tmp_path / "model")
    (tmp_path / "text.txt").write_text(TEXT)
    monkeypatch.setattr(progress_module, "HEARTBEAT_SECONDS", 0.0)
    common = ["extract", "--model", str(tmp_path / "model"), "--summary", "--samples", "3", "--seq-len", "40",
              "--resolution", "8", "--text", str(tmp_path / "text.txt"), "--device", "cpu"]  # fmt: skip
    code, _, err = run_cli([*common, "--out", str(tmp_path / "a.h5")], capsys)
    assert code == 0, err
    beats = [line for line in err.splitlines() if line.startswith("summarise")]
    assert len(beats) >= 3 and "\r" not in err
    assert all("/" in line and "<" in line for line in beats)  # count, rate, time left
    # one count per phase, named on every line: the forward (3 samples x 2 layers), then the layer's blocks
    phases: dict[str, list[tuple[int, int]]] = {}
    for line in beats:
        m = re.match(r"summarise \(phase \d of 2\): (forward|layer 1): +\d+% (\d+)/(\d+) \[", line)
        assert m, line
        phases.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(3))))
    assert list(phases) == ["forward", "layer 1"], list(phases)
    assert {total for _, total in phases["forward"]} == {3 * 2}
    for counts in phases.values():
        assert [d for d, _ in counts] == sorted(d for d, _ in counts) and counts[-1][0] == counts[-1][1]
    assert all(line.startswith("summarise (phase 1 of 2): forward") for line in beats[: len(phases["forward"])])
    code, _, err = run_cli([*common, "--out", str(tmp_path / "b.h5"), "--quiet"], capsys)
    assert code == 0 and not [line for line in err.splitlines() if line.startswith("summarise")], err
