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
from tests.extraction.one_layer import (
    OneLayer,
    assert_as_reference,
    batch_size,
    first_tokens,
    forwards_of,
    joined,
    positions,
)
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, kept_softmax, reference

N = 3
PREFIX = 1  # the token that marks a sample's prefix, at its start


class PrefixLM(OneLayer):
    """A query in its sample's prefix sees the whole prefix, any other query the keys up to itself."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        prefix = (ids == PREFIX).sum(-1)[:, None, None]
        return ((j <= i)[None] | ((i < prefix) & (j < prefix)))[:, None]  # (B, 1, T, T)


class PrefixBiasLM(PrefixLM):
    """The same cells, with an additive bias in the call's float mask that is not of i - j alone: -0.1·|i - j| plus a
    term of the query and the key, -inf where the call masks."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        bias = -0.1 * (i - j).abs() + 0.3 * torch.sin(i.float()) * torch.cos(0.5 * j.float())
        return torch.where(super().keep(ids), bias, float("-inf"))


class PrefixWindowLM(PrefixLM):
    """Outside its prefix, a query sees the 5 keys up to itself: a mask of the call's own before the turn."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        return super().keep(ids) & ((i - j < 5) | (j > i))


MODELS = {"": PrefixLM, ", a bias": PrefixBiasLM, ", a window": PrefixWindowLM}


def _model(bias: bool = False, kind: str = "") -> tuple[OneLayer, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(PREFIX + 1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    ids[1, :4] = PREFIX  # sample 0 has no prefix: its call is causal
    ids[2, :7] = PREFIX
    return MODELS[", a bias" if bias else kind]().eval(), ids


@pytest.fixture(scope="module", params=[(way, batch, r, kind) for way in ("formed again", "streamed")
                                        for batch, r in ((1, T), (N, T), (1, T // 2)) for kind in MODELS],
                ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}{p[3]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import biasviz.extraction.summary as summary
    import biasviz.summaries.layer as layer

    way, batch, resolution, kind = request.param
    bias = kind == ", a bias"
    model, ids = _model(kind=kind)
    call = caught_call(lambda: model(ids))
    assert (call["kept"][1] & np.triu(np.ones((T, T), dtype=bool), 1)).any()  # sample 1's prefix sees past i
    out = tmp_path_factory.mktemp("prefix") / "s.h5"
    forwards = forwards_of(model, batch_size)  # the samples of each forward
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
    return {"stored": stored, "attrs": attrs, "expected": reference(call, T // resolution), "way": way, "batch": batch,
            "bias": bias,
            "said": [str(w.message) for w in said], "forwards": forwards}  # fmt: skip


def test_the_call_is_taken_as_one_that_sees_every_key_and_said(summarised: dict[str, Any]) -> None:
    """Said once, and nothing starts again: from the sample that showed it on, the samples before keeping the cells they
    attended (streamed in one batch, none came before)."""
    said = [w for w in summarised["said"] if "attended keys after a query" in w]
    assert len(said) == 1, summarised["said"]
    assert not any("again" in w for w in said), said
    one_batch = summarised["way"] == "streamed" and summarised["batch"] == N
    assert said[0].endswith("from the first sample on") == one_batch, said[0]
    if summarised["way"] == "streamed" and not one_batch:
        assert "the summary goes on, the samples before sample 1 keeping the cells they attended" in said[0], said[0]
    assert summarised["attrs"]["mask"] == "model"


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "context_mass", "weights_entropy", "attention_distance"])
def test_every_cell_the_call_attends_counts(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


@pytest.mark.parametrize("name", ["weights_profile_se", "scores_profile_se", "weights_key_profile_se",
                                  "band_mass_se", "weights_mean_se", "scores_mean_se"])  # fmt: skip
def test_standard_errors_over_every_cell_the_call_attends(summarised: dict[str, Any], name: str) -> None:
    """The profiles' SEs run over i - j on both sides of the query, as a call that sees every key has them."""
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-4, 1e-5)


@pytest.mark.parametrize("name", ["bias_mean", "bias_std", "bias_profile", "bias_mean_se"])
def test_the_bias_over_every_cell_the_call_attends(summarised: dict[str, Any], name: str) -> None:
    if not summarised["bias"]:
        pytest.skip("the call adds no bias")
    if name not in summarised["expected"] or (name.endswith("_se") and summarised["expected"][name] is None):
        pytest.skip("no standard error of blocks of one cell")
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 2e-6)


def _kept_weights(call: dict[str, np.ndarray]) -> np.ndarray:
    """(N, H, T, T) float64: each row's softmax over the caught call's own cells."""
    scores = call["scale"] * np.einsum("nhid,nhjd->nhij", call["q"], call["k"]) + call["added"]
    return kept_softmax(scores, call["kept"])


@pytest.mark.parametrize("batch", [1, N])
def test_a_full_file_stores_the_cells_after_the_query(tmp_path: Path, batch: int) -> None:
    """A full file's weights as the model formed them, the prefix's cells after their query included (a causal file
    would have stored 0 there): softmax over the caught call's own cells, float64. Sample 1 shows it: the file goes on
    from its batch, and nothing runs again."""
    model, ids = _model()
    call = caught_call(lambda: model(ids))
    out = tmp_path / "f.h5"
    forwards = forwards_of(model, batch_size)  # the samples of each forward
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, progress=False, batch_size=batch, capture="weights")
    said = [str(x.message) for x in said if "attended keys after a query" in str(x.message)]
    assert len(said) == 1, said
    start = 1 if batch == 1 else 0
    assert f"the file stores every cell of the call from sample {start} on" in said[0], said[0]
    assert forwards[1:] == [batch] * (N // batch), forwards  # after the probe
    with h5py.File(out) as f:
        got = f["layer_0/weights"][()]
        assert not f.attrs["causal"] and "causal" not in f["layer_0"].attrs
    np.testing.assert_allclose(got, _kept_weights(call), rtol=1e-5, atol=1e-6)


class PrefixThenCausal(torch.nn.Module):
    """Two calls: the prefix's (:class:`PrefixLM`), then a causal one over its output."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = PrefixLM(), PrefixLM()
        self.second.keep = lambda ids: positions(ids.shape[1])[1] <= positions(ids.shape[1])[0]  # type: ignore

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.first(ids) + self.second(ids)


def test_a_full_file_that_goes_on_says_each_call_s_rule(tmp_path: Path) -> None:
    """The file's rule turns to every key with the call that turned; the call that stayed causal says so itself, as
    the reader reads it, and holds 0 after each query."""
    from biasviz.store import BiasFile

    _, ids = _model()
    torch.manual_seed(0)
    out = tmp_path / "f.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(PrefixThenCausal().eval(), ids.numpy(), out, progress=False, batch_size=1, capture="weights",
                        layers="all")  # fmt: skip
    with BiasFile(out) as f:
        assert not f.causal and not f.layer_causal(0) and f.layer_causal(1)
        after = np.triu(np.ones((T, T), dtype=bool), 1)
        assert (f.read("weights", 1)[..., after] == 0).all()
        assert (f.read("weights", 0)[1][..., after] > 0).any()  # sample 1's prefix


@pytest.mark.parametrize("capture", ["bias,weights", "weights,scores"])
def test_a_full_file_of_the_bias_or_scores_is_refused_at_once(tmp_path: Path, capture: str) -> None:
    """The samples before held their mask after each query in their bias and scores, within the rule of a call that
    sees every key: refused, saying what to do, before any later batch; nothing is left at the output."""
    from biasviz.common.errors import BiasvizError

    model, ids = _model(bias=True)
    out = tmp_path / "f.h5"
    forwards = forwards_of(model, batch_size)  # the samples of each forward
    with pytest.raises(BiasvizError, match="attended keys after a query.*samples before sample 1 attended only keys "
                                           "up to their query.*--summary.*--capture weights"):  # fmt: skip
        biasviz.extract(model, ids.numpy(), out, progress=False, batch_size=1, capture=capture)
    assert forwards[1:] == [1, 1], forwards
    assert not out.exists()


def test_under_torchrun_a_summary_whose_call_turns_part_way_is_refused() -> None:
    """The processes join one mask for every sample: refused, with what to do."""
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.common.errors import BiasvizError
    from biasviz.extraction.summary import summary_run

    model, ids = _model()
    with pytest.raises(BiasvizError, match="attended keys after a query.*under torchrun.*run it in one process"):
        summary_run(TracedAdapter(model), ids.numpy(), resolution=T, batch_size=1, device="cpu", progress=False,
                    merge=lambda parts, position: True, total_samples=N)  # fmt: skip


def test_no_sample_runs_again(summarised: dict[str, Any]) -> None:
    """After the probe of the first sample that finds the calls, each batch's forward runs once, formed again or
    streamed."""
    probe, *forwards = summarised["forwards"]
    assert probe == 1
    assert forwards == [summarised["batch"]] * (N // summarised["batch"]), forwards


RESCALE = 2  # a text holding it is attended with another scale (:class:`PrefixRescaled`)


class PrefixRescaled(PrefixLM):
    """The prefix's cells, scaled by 1/4 rather than 1/sqrt(8) where the text holds RESCALE."""

    def scale(self, ids: torch.Tensor) -> float | None:
        return 0.25 if bool((ids == RESCALE).any()) else None


def test_rows_turned_to_streaming_then_a_call_that_sees_past_its_query(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows formed again until sample 1's scale differs (streamed from there, sample 0 formed again from its bank),
    then sample 2's prefix seen both ways (the streamed sums widen): each sample's forward runs once after the probe
    but sample 1's, and every map, profile, measure and SE is float64 math on each sample's own call (two query rows a
    step, as the fixture's)."""
    import biasviz.summaries.layer as layer

    monkeypatch.setattr(layer, "CELLS_PER_STEP", HEADS * T * 2)
    torch.manual_seed(0)
    model = PrefixRescaled().eval()
    ids = torch.randint(RESCALE + 1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    ids[1, [3, 9]] = RESCALE
    ids[2, :6] = PREFIX
    calls = [caught_call(lambda a=a: model(ids[a : a + 1])) for a in range(N)]
    forwards = forwards_of(model, first_tokens)  # each sample the model runs
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), tmp_path / "s.h5", summary=True, progress=False, batch_size=1)
    said = [str(w.message) for w in said]
    assert any("goes on streamed" in w for w in said), said
    assert any("the summary goes on, the samples before sample 2 keeping the cells they attended" in w for w in said)
    assert forwards[1:] == ids[[0, 1, 1, 2], 0].tolist(), forwards  # after the probe: kept 0, 1; streamed 1, 2
    with h5py.File(tmp_path / "s.h5", "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
    expected = reference(joined(calls), 1)
    for name in [*NAMES, "band_mass", "context_mass", "weights_entropy", "attention_distance"]:
        assert_as_reference(stored[name], expected[name], name, 2e-5, 1e-5)
    for name in ("weights_profile_se", "scores_profile_se", "weights_key_profile_se", "band_mass_se"):
        assert_as_reference(stored[name], expected[name], name, 2e-4, 1e-5)
