"""Calls that mask their heads differently as well as their samples: rows formed again keep each sample's cells one
set a head, so the summary forms them again in one pass of the model, as it forms any call's (no start again).

Two models: heads that see windows of their own over each sample's left padding (heads differ in every sample), and
heads that differ only in a sample holding a marker token (the bank's one set of cells for all heads widened part-way
with batches of one, and a later one-for-all sample given to every head). Each sample's own cells of each head count
for it; the reference is float64 numpy on the q, k, scale and mask caught at the model's own SDPA call (torch's
function wrapped, not through biasviz), by the rule of docs/hdf5.md, 'Attended cells'."""

from __future__ import annotations

import warnings
from typing import Any

import h5py
import pytest
import torch

import biasviz
from tests.extraction.one_layer import OneLayer, assert_as_reference, positions
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 3
PADS = (0, 5, 2)  # left padding of each sample (token 0)
WINDOWS = (2, 5, 9, T)  # the keys each head sees, back from its query
MARK = 1  # a key the odd heads skip


class HeadWindows(OneLayer):
    """Heads that see windows of their own, keys that are padding left out; ``marked``: the heads see every key up to
    the query, but the odd ones skip keys holding :data:`MARK`."""

    def __init__(self, marked: bool = False) -> None:
        super().__init__()
        self.marked = marked

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        keep = (j <= i)[None, None] & (ids != 0)[:, None, None, :]  # (B, 1, T, T)
        if self.marked:
            odd = (torch.arange(HEADS) % 2 == 1)[None, :, None, None]
            return keep & ~(odd & (ids == MARK)[:, None, None, :])
        return keep & (i - j < torch.tensor(WINDOWS)[:, None, None])[None]


def _ids(marked: bool) -> torch.Tensor:
    ids = torch.randint(MARK + 1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    if marked:  # sample 0 plain (causal), 1 marked (heads differ), 2 padded (one set for all heads)
        ids[1, [3, 8, 9]] = MARK
        ids[2, :4] = 0
    else:
        for a, p in enumerate(PADS):
            ids[a, :p] = 0
    return ids


@pytest.fixture(scope="module", params=[(marked, batch, r) for marked in (False, True) for batch, r in
                                        ((1, T), (N, T), (1, T // 2))],
                ids=lambda p: f"{'marked' if p[0] else 'windows'}, batch {p[1]}, R {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import biasviz.extraction.summary as summary
    import biasviz.summaries.replay as replay

    marked, batch, resolution = request.param
    torch.manual_seed(0)
    model = HeadWindows(marked).eval()
    ids = _ids(marked)
    call = caught_call(lambda: model(ids))
    kept = call["kept"]
    assert not (kept == kept[:, :1]).all() and not (kept == kept[:1]).all()  # heads differ, and samples

    def streamed(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("streamed instead of formed again")

    out = tmp_path_factory.mktemp("heads") / "s.h5"
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as said:
        patch.setattr(summary, "_streamed", streamed)
        patch.setattr(replay, "MIN_REPLAY_ROWS", 1)  # blocks of a few rows, each reading its cells
        patch.setattr(replay, "REPLAY_BYTES", 3 * HEADS * T * (replay.CELL_BYTES + replay.SAMPLE_CELL_BYTES))
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=batch,
                        resolution=resolution)  # fmt: skip
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
        note = f["layer_0"].attrs.get("note", "")
    return {"stored": stored, "note": note, "expected": reference(call, T // resolution),
            "said": [str(w.message) for w in said]}  # fmt: skip


def test_the_summary_forms_the_rows_again_in_one_pass(summarised: dict[str, Any]) -> None:
    assert not any("started again" in w for w in summarised["said"]), summarised["said"]
    assert any("samples masked differently" in w for w in summarised["said"])  # what it leaves out, said
    assert "samples masked differently" in summarised["note"] and "positional_mean" not in summarised["stored"]


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "context_mass", "weights_entropy", "attention_distance"])
def test_each_head_s_own_cells_of_each_sample_count_for_it(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


@pytest.mark.parametrize("name", ["weights_profile_se", "scores_profile_se", "weights_key_profile_se", "sink_share_se",
                                  "band_mass_se", "context_mass_se", "weights_entropy_se", "weights_mean_se",
                                  "scores_mean_se"])  # fmt: skip
def test_standard_errors_over_each_head_s_own_cells(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-4, 1e-5)
