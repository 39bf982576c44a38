"""A call whose scale changes between samples (here with the text): rows formed again take one scale for every sample,
so the summary goes on streamed as the model forms each sample's rows from the batch that showed it, the samples before
formed again from what their forward kept, and says so, whether the scale changes before or after the samples' masks
turn out to differ (before, a scale that changed after that was not seen, and each later sample's rows were formed with
the first's). Only that batch runs through the model again: before, every sample did. The reference is float64 numpy on
each sample's own call, caught at the model's SDPA call one sample at a time (docs/hdf5.md, 'Attended cells')."""

from __future__ import annotations

import warnings
from typing import Any

import h5py
import pytest
import torch

import biasviz
from tests.extraction.one_layer import MARK, Rescaled, assert_as_reference, first_tokens, forwards_of, joined
from tests.summaries.test_sample_cells import NAMES, VOCAB, T, caught_call, reference

N = 3
@pytest.fixture(scope="module", params=["padded, then rescaled", "rescaled, then padded"])
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Rescaled("padded").eval()
    ids = torch.randint(MARK + 1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    padded, rescaled = (1, 2) if request.param.startswith("padded") else (2, 1)
    ids[padded, :5] = 0
    ids[rescaled, [3, 9]] = MARK
    calls = [caught_call(lambda a=a: model(ids[a : a + 1])) for a in range(N)]
    assert float(calls[rescaled]["scale"]) != float(calls[0]["scale"])
    out = tmp_path_factory.mktemp("scales") / "s.h5"
    forwards = forwards_of(model, first_tokens)  # each sample the model runs
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=1)
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
    return {"stored": stored, "expected": reference(joined(calls), 1), "said": [str(w.message) for w in said],
            "rescaled": rescaled, "forwards": forwards, "ids": ids}  # fmt: skip


def test_the_summary_says_it_goes_on_streamed(summarised: dict[str, Any]) -> None:
    said = [w for w in summarised["said"] if "streamed" in w]
    rescaled = summarised["rescaled"]
    assert len(said) == 1 and "scaled q·k by 0.25" in said[0], summarised["said"]
    before = "the sample before it" if rescaled == 1 else f"the {rescaled} samples before it"
    assert f"from sample {rescaled} on, {before} formed again" in said[0], said[0]
    assert not [w for w in summarised["said"] if "started again" in w], summarised["said"]


def test_only_the_batch_that_showed_it_runs_again(summarised: dict[str, Any]) -> None:
    """The probe's sample 0, every sample once as it is kept, then the rescaled one again, streamed, and the ones
    after it: before, every sample ran again from the first."""
    first = summarised["ids"][:, 0].tolist()
    rescaled = summarised["rescaled"]
    kept = first[: rescaled + 1]  # the keeping forward stopped at the sample that showed the scale
    assert summarised["forwards"] == first[:1] + kept + first[rescaled:], summarised["forwards"]


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "weights_entropy", "weights_profile_se"])
def test_each_sample_s_rows_are_formed_with_its_own_scale(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)
