"""What ``--force`` may replace (:mod:`biasviz.training.checkpoints`): a folder of the user's is kept."""

from __future__ import annotations

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.training.loop import train
from tests.training.test_loop import corpus, settings  # noqa: F401  (corpus: fixture)


def test_existing_output_is_kept_without_force(corpus, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "precious.txt").write_text("mine")
    with pytest.raises(BiasvizError, match="already exists"):
        train(settings("t5", corpus), out, progress=False)
    assert (out / "precious.txt").read_text() == "mine"
