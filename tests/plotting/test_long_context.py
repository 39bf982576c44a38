"""The long-context figure (:mod:`biasviz.plotting.long_context`) as a reviewer reads it at a column's and a page's
width: no two texts overlap once drawn, no text is below 6 pt, and the title says what is shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plotting.test_dynamics_layout import check_print
from tests.summary_files import alibi, weights_of, write_summary

TRAINING = '{"preset": "tiny", "steps": 300, "seq_len": 128, "corpus": "stdlib:/x"}'


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two summaries of 12 heads at 64 positions in blocks of 4: a long scheme name makes a wide title."""
    root = tmp_path_factory.mktemp("long")
    bias = alibi(2, 12, 64)
    return [write_summary(root / f"{s}.h5", s, bias=bias, weights=weights_of(bias), resolution=16,
                          attrs={"training": TRAINING}) for s in ("alibi", "kerple-log")]  # fmt: skip


@pytest.mark.parametrize("style", ["neurips", "icml-column"])
def test_long_context_titles_and_ticks_never_overlap(summaries: list[Path], style: str) -> None:
    from biasviz.plotting.long_context import long_context_figure
    from biasviz.store import open_bias_file

    files = [open_bias_file(p) for p in summaries]
    try:
        fig = long_context_figure(files, train_len=16, style=style)
    finally:
        for f in files:
            f.close()
    texts = [t for t, _, _ in check_print(fig, style)]
    title = fig.get_suptitle().replace("\n", " ")
    assert "T = 64" in title and "mean of 2 samples" in title and "block means of 4 × 4 positions" in title
    assert "tiny model, 300 training steps" in title, title
    assert {"ALiBi", "KERPLE-log"} <= set(texts)  # each row named once, its panels titled short
    bars = [ax for ax in fig.findobj(lambda a: getattr(a, "get_label", None) and a.get_label() == "<colorbar>")]
    assert bars and all(ax.get_ylabel() for ax in bars), "every colorbar says its quantity"
