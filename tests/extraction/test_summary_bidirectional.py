"""Calls that see keys after their query (encoders) formed again from the bank, against every key, block of rows by
block of rows: every key, a window on both sides of the query, each sample's own padding.

Before, such a call was streamed whole, keeping per-cell moments of the (H, T, T) matrix and each batch's whole
(B, H, T, T) block; formed again, memory is a block of rows plus the bank, as for causal calls. The reference is float64
numpy on the q, k, scale and mask caught at the model's own SDPA call (docs/hdf5.md, 'Attended cells'); P, which that
reference does not form, is compared with the same call streamed whole (the other way in, with references of its own).
"""

from __future__ import annotations

import warnings
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import biasviz
from tests.extraction.one_layer import OneLayer, assert_as_reference, positions
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 3
HOWS = ("every key", "window", "padding")


class Encoder(OneLayer):
    """Sees keys on both sides of its query: every key, those within 4 positions, or every key that is not padding
    (token 0)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def keep(self, ids: torch.Tensor) -> torch.Tensor | None:
        i, j = positions(ids.shape[1])
        return {"every key": None, "window": ((i - j).abs() < 5)[None, None],
                "padding": (ids != 0)[:, None, None, :]}[self.how]  # fmt: skip


def _summary(model: nn.Module, ids: torch.Tensor, out: Any, batch: int, resolution: int, streamed: bool) -> list[str]:
    import biasviz.extraction.summary as summary
    import biasviz.summaries.layer as layer
    import biasviz.summaries.replay as replay

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("streamed instead of formed again")

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        patch.setattr(layer, "CELLS_PER_STEP", HEADS * T * 2)  # two rows a step
        if streamed:
            patch.setattr(summary, "forms_rows_again", lambda adapter: False)
        else:
            patch.setattr(summary, "_streamed", refused)
            patch.setattr(replay, "MIN_REPLAY_ROWS", 1)  # blocks of a few rows, each against every key
            patch.setattr(replay, "REPLAY_BYTES", 3 * HEADS * T * (replay.CELL_BYTES + replay.SAMPLE_CELL_BYTES))
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=batch, resolution=resolution)
    return [str(w.message) for w in said]


def _read(path: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with h5py.File(path, "r") as f:
        return {key: f["layer_0"][key][()] for key in f["layer_0"]}, {**f.attrs, **f["layer_0"].attrs}


@pytest.fixture(scope="module", params=[(how, batch, r) for how in HOWS for batch, r in ((1, T), (N, T // 2))],
                ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    how, batch, resolution = request.param
    torch.manual_seed(0)
    model = Encoder(how).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    if how == "padding":
        ids[1, :5] = 0
        ids[2, -3:] = 0
    call = caught_call(lambda: model(ids))
    tmp = tmp_path_factory.mktemp("encoder")
    said = _summary(model, ids, tmp / "again.h5", batch, resolution, streamed=False)
    _summary(model, ids, tmp / "streamed.h5", batch, resolution, streamed=True)
    (stored, attrs), (streamed, streamed_attrs) = _read(tmp / "again.h5"), _read(tmp / "streamed.h5")
    return {"how": how, "stored": stored, "attrs": attrs, "streamed": streamed, "streamed_attrs": streamed_attrs,
            "expected": reference(call, T // resolution, differ=how == "padding"), "said": said}  # fmt: skip


def test_the_rule_is_every_key(summarised: dict[str, Any]) -> None:
    assert summarised["attrs"]["mask"] == ("bidirectional" if summarised["how"] == "every key" else "model")
    assert not any("started again" in w for w in summarised["said"])


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "context_mass", "weights_entropy", "attention_distance"])
def test_every_cell_the_call_attends_counts(summarised: dict[str, Any], name: str) -> None:
    if name == "attended" and summarised["how"] == "every key":
        assert name not in summarised["stored"]  # no mask of its own: nothing to say of its cells
        return
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


@pytest.mark.parametrize("name", ["weights_profile_se", "scores_profile_se", "weights_key_profile_se", "sink_share_se",
                                  "band_mass_se", "weights_mean_se", "scores_mean_se"])  # fmt: skip
def test_standard_errors_over_every_cell_the_call_attends(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-4, 1e-5)


def test_formed_again_as_the_call_streamed_whole_gives_it(summarised: dict[str, Any]) -> None:
    """Every dataset and attribute of the two ways in, P's among them (where samples share one mask)."""
    got, want = summarised["stored"], summarised["streamed"]
    assert got.keys() == want.keys()
    assert ("positional_mean" in got) == (summarised["how"] != "padding")
    for name, values in want.items():
        if values.dtype.names:  # the diagnostics' table
            for field in values.dtype.names:
                np.testing.assert_allclose(got[name][field], values[field], rtol=1e-4, atol=1e-6, equal_nan=True,
                                           err_msg=f"{name}.{field}")  # fmt: skip
        else:
            np.testing.assert_allclose(got[name], values, rtol=1e-4, atol=1e-6, equal_nan=True, err_msg=name)
    for key in ("mask", "note"):
        assert summarised["attrs"].get(key) == summarised["streamed_attrs"].get(key), key
