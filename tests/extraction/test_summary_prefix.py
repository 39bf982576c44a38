"""A call whose first sample attends causally while a later one attends keys after a query (a prefix seen both ways,
its length set by the text, as prefix language models do). The first sample's call is no declaration: the call is
taken as one that sees every key within its own mask, and what was taken as causal is taken again, said.

Before, a summary kept such a call causal: a block of query rows took no key past its last row, so at a length where a
block holds fewer rows than the prefix the prefix's cells after their query were lost from the maps and the band mass.
Here a block holds two rows (the steps made small) and the reference is float64 numpy on the q, k, scale and mask caught
at the model's own SDPA call, by docs/hdf5.md, 'Attended cells'."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.extraction.one_layer import OneLayer, assert_as_reference, positions
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 3
PREFIX = 1  # the token that marks a sample's prefix, at its start


class PrefixLM(OneLayer):
    """A query in its sample's prefix sees the whole prefix, any other query the keys up to itself."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        prefix = (ids == PREFIX).sum(-1)[:, None, None]
        return ((j <= i)[None] | ((i < prefix) & (j < prefix)))[:, None]  # (B, 1, T, T)


def _model() -> tuple[OneLayer, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(PREFIX + 1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    ids[1, :4] = PREFIX  # sample 0 has no prefix: its call is causal
    ids[2, :7] = PREFIX
    return PrefixLM().eval(), ids


@pytest.fixture(scope="module", params=[(way, batch, r) for way in ("formed again", "streamed")
                                        for batch, r in ((1, T), (N, T), (1, T // 2))],
                ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import biasviz.extraction.summary as summary
    import biasviz.summaries.layer as layer

    way, batch, resolution = request.param
    model, ids = _model()
    call = caught_call(lambda: model(ids))
    assert (call["kept"][1] & np.triu(np.ones((T, T), dtype=bool), 1)).any()  # sample 1's prefix sees past i
    out = tmp_path_factory.mktemp("prefix") / "s.h5"
    forwards: list[int] = []  # the samples of each forward of the model (each forms its mask once)
    keep = model.keep
    model.keep = lambda ids: (forwards.append(int(ids.shape[0])), keep(ids))[1]  # type: ignore[method-assign]
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as said:
        patch.setattr(layer, "CELLS_PER_STEP", HEADS * T * 2)  # two query rows a step
        if way == "streamed":  # as a model whose rows biasviz cannot form again runs
            patch.setattr(summary, "forms_rows_again", lambda adapter: False)
        else:  # formed again against every key, nothing run again

            def refused(*args: Any, **kwargs: Any) -> None:
                raise AssertionError("streamed instead of formed again")

            patch.setattr(summary, "_streamed", refused)
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=batch,
                        resolution=resolution)  # fmt: skip
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
        attrs = dict(f.attrs)
    return {"stored": stored, "attrs": attrs, "expected": reference(call, T // resolution), "way": way,
            "said": [str(w.message) for w in said], "forwards": forwards}  # fmt: skip


def test_the_call_is_taken_as_one_that_sees_every_key_and_said(summarised: dict[str, Any]) -> None:
    """Said once. Rows formed again from what each sample's forward kept: from the sample that showed it on, the samples
    before keeping the cells they attended, and no forward runs again; streamed rows, summarised as they came: from the
    first sample again."""
    said = [w for w in summarised["said"] if "attended keys after a query" in w]
    assert len(said) == 1, summarised["said"]
    again = "started again from the first sample" in said[0]
    assert again == (summarised["way"] == "streamed"), said[0]
    assert summarised["attrs"]["mask"] == "model"


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "context_mass", "weights_entropy", "attention_distance"])
def test_every_cell_the_call_attends_counts(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


@pytest.mark.parametrize("name", ["weights_profile_se", "scores_profile_se", "weights_key_profile_se",
                                  "band_mass_se", "weights_mean_se", "scores_mean_se"])  # fmt: skip
def test_standard_errors_over_every_cell_the_call_attends(summarised: dict[str, Any], name: str) -> None:
    """The profiles' SEs run over i - j on both sides of the query, as a call that sees every key has them."""
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-4, 1e-5)


def test_a_full_file_is_written_again_with_the_cells_after_the_query(tmp_path: Path) -> None:
    """A full file's weights as the model formed them, the prefix's cells after their query included (a causal file
    would have stored 0 there): softmax over the caught call's own cells, float64."""
    model, ids = _model()
    call = caught_call(lambda: model(ids))
    scores = call["scale"] * np.einsum("nhid,nhjd->nhij", call["q"], call["k"])
    z = np.where(call["kept"], scores, -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = tmp_path / "f.h5"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, progress=False, batch_size=1, capture="weights")
    assert any("attended keys after a query" in str(x.message) and "written again" in str(x.message) for x in said)
    with h5py.File(out) as f:
        got = f["layer_0/weights"][()]
        assert not f.attrs["causal"]
    np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_under_torchrun_a_summary_that_would_start_again_is_refused() -> None:
    """The other processes would not start again with this one: refused, with what to do."""
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.common.errors import BiasvizError
    from biasviz.extraction.summary import summary_run

    model, ids = _model()
    with pytest.raises(BiasvizError, match="attended keys after a query.*under torchrun.*run it in one process"):
        summary_run(TracedAdapter(model), ids.numpy(), resolution=T, batch_size=1, device="cpu", progress=False,
                    merge=lambda parts, position: True, total_samples=N)  # fmt: skip


def test_rows_formed_again_run_each_sample_once(summarised: dict[str, Any]) -> None:
    """Formed again, each sample's forward runs once (after the probe of the first sample that finds the calls);
    streamed, the samples before the one that showed it run again."""
    probe, *forwards = summarised["forwards"]
    assert probe == 1
    assert (sum(forwards) == N) == (summarised["way"] == "formed again"), summarised["forwards"]
