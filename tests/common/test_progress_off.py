"""``progress=False`` in the Python API means no progress output at all: not biasviz's own lines, and not the
"Loading weights" bar transformers draws while ``from_pretrained`` reads a checkpoint. The bars transformers
(and the Hugging Face Hub) had switched on or off before the call are as they were after it.

What the call writes is read from the process's own stdout and stderr (file descriptors 1 and 2), with the
bars switched on as a notebook has them; the same call with ``progress`` left at its default shows the bar, so
the capture does see one when it is there.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import biasviz
from tests.conftest import small_model

BAR = re.compile(r"Loading weights|\d+/\d+ \[|it/s\]|%\|")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of two tiny biasviz checkpoints (checkpoint-0, checkpoint-100), as ``train --save-every`` writes."""
    root = tmp_path_factory.mktemp("runs") / "rope"
    for k, step in enumerate((0, 100)):
        small_model("rope", seed=k).save_pretrained(root / f"checkpoint-{step}")
    return root


@pytest.fixture
def bars_on() -> Iterator[object]:
    """transformers' and the Hub's bars switched on (a notebook's default); the state before, restored after."""
    from transformers.utils import logging as hf_logging

    hub = importlib.import_module("huggingface_hub.utils.tqdm")
    was_on, states = hf_logging.is_progress_bar_enabled(), dict(hub.progress_bar_states)
    hf_logging.enable_progress_bar()
    yield hf_logging
    (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
    hub.progress_bar_states.clear()
    hub.progress_bar_states.update(states)


IDS = np.random.default_rng(0).integers(0, 97, size=(2, 16))


def test_extract_with_progress_false_prints_no_loading_bar(checkpoints: Path, bars_on: object, tmp_path: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    model = checkpoints / "checkpoint-0"
    capfd.readouterr()
    biasviz.extract(model, IDS, tmp_path / "shown.h5", layers="all", device="cpu")  # progress left as it is
    shown = capfd.readouterr()
    assert BAR.search(shown.err + shown.out), shown  # the capture sees transformers' bar when there is one
    for summary in (False, True):
        biasviz.extract(model, IDS, tmp_path / f"quiet-{summary}.h5", layers="all", device="cpu", summary=summary,
                        progress=False)  # fmt: skip
        quiet = capfd.readouterr()
        assert quiet.err == "" and quiet.out == "", quiet
    assert bars_on.is_progress_bar_enabled()  # switched back on after the call


def test_progress_false_leaves_bars_that_were_off_off(checkpoints: Path, bars_on: object, tmp_path: Path) -> None:
    hub = importlib.import_module("huggingface_hub.utils.tqdm")
    bars_on.disable_progress_bar()
    hub.disable_progress_bars("huggingface_hub.some_group")
    before = dict(hub.progress_bar_states)
    biasviz.extract(checkpoints / "checkpoint-0", IDS, tmp_path / "q.h5", device="cpu", progress=False)
    assert not bars_on.is_progress_bar_enabled()
    assert hub.progress_bar_states == before


def test_a_sweep_with_progress_false_prints_nothing(checkpoints: Path, bars_on: object, tmp_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from biasviz.extraction.sweep import extract_sweep

    capfd.readouterr()
    extract_sweep(checkpoints, "all", IDS, tmp_path / "sweep.h5", device="cpu", progress=False)
    quiet = capfd.readouterr()
    assert quiet.err == "" and quiet.out == "", quiet
    assert bars_on.is_progress_bar_enabled()
