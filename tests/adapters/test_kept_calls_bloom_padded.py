"""BLOOM given left padding that differs by sample (docs/hdf5.md, 'Attended cells'). Its positions start after the
padding, so its bias m_h·(j - p) differs by sample as well as its cells. Each sample's own row of keys is kept beside
its q and k (:class:`~biasviz.adapters.kept_calls.KeptCalls`), and the rows are formed again: nothing is started again.
The file is the one the rows streamed whole give; the weights and the bias are the library's own, float64 numpy of
``output_attentions`` and of ``build_alibi_tensor`` on each sample's own cells."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.extraction.one_layer import assert_same_datasets, both_ways
from tests.summaries.test_sample_cells import HEADS, VOCAB, T, block_means, per_cell
from tests.summaries.test_sample_cells_padded_llama import left_padded

N = 3
PADS = (3, 0, 5)  # the first sample padded: its cells show part of its bias, and the later ones other values


def _model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, Any]:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=HEADS)).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(3))
    return model, ids, *left_padded(model, ids, PADS)


@pytest.fixture(scope="module", params=[1, N], ids=lambda b: f"batch {b}")
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    model, ids, pad, forward = _model()
    got = both_ways(model, ids, tmp_path_factory.mktemp("bloom"), request.param, T, forward=forward)
    with torch.no_grad():
        weights = model(ids, attention_mask=pad, output_attentions=True).attentions[0].double().numpy()
    bias = build_alibi_tensor(pad, HEADS, torch.float32).view(N, HEADS, 1, T).expand(N, HEADS, T, T).double().numpy()
    i, j = np.indices((T, T))
    kept = np.stack([(j <= i) & (j >= p) for p in PADS])[:, None].repeat(HEADS, 1)  # (N, H, T, T): each one's own
    return {**got, "weights": weights, "bias": bias, "kept": kept}


def test_the_rows_are_formed_again_and_nothing_starts_again(summarised: dict[str, Any]) -> None:
    assert not summarised["went_streamed"]
    assert not [w for w in summarised["said"] if "started again" in w], summarised["said"]


def test_the_bias_differs_by_sample() -> None:
    """What the test is about: BLOOM's own bias of a cell both samples attend is not the same."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    _, _, pad, _ = _model()
    alibi = build_alibi_tensor(pad, HEADS, torch.float32).view(N, HEADS, T)
    assert not torch.equal(alibi[0, :, 6:], alibi[1, :, 6:])


@pytest.mark.parametrize("kind", ["weights", "bias"])
def test_the_maps_over_each_sample_s_own_cells_are_the_library_s(summarised: dict[str, Any], kind: str) -> None:
    kept, stored = summarised["kept"], summarised["stored"]
    mean, spread = per_cell(summarised[kind], kept)
    union = kept.any(0)
    for name, want in ((f"{kind}_mean", mean), (f"{kind}_std", spread)):
        want = block_means(want, union, 1)
        assert np.array_equal(np.isnan(stored[name]), np.isnan(want)), name
        np.testing.assert_allclose(stored[name], want, rtol=2e-5, atol=2e-6, equal_nan=True, err_msg=name)


def test_formed_again_as_the_rows_streamed_whole_give_it(summarised: dict[str, Any]) -> None:
    """Every dataset of the two ways in."""
    assert "bias_mean" in summarised["stored"] and "scores_mean" in summarised["stored"]
    assert_same_datasets(summarised["stored"], summarised["streamed"], atol=2e-6)
