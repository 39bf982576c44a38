"""A call that masks its heads differently as well as its samples (a window of its own per head, over each sample's
left padding): rows formed again hold one set of cells per sample for every head, so the summary starts again,
streamed as the model forms its rows, and says so. Each sample's own cells of each head count for it; the reference is
float64 numpy on the q, k, scale and mask caught at the model's own SDPA call (torch's function wrapped, not through
biasviz), by the rule of docs/hdf5.md, 'Attended cells'."""

from __future__ import annotations

import warnings
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import biasviz
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 3
PADS = (0, 5, 2)  # left padding of each sample (token 0)
WINDOWS = (2, 5, 9, T)  # the keys each head sees, back from its query


class HeadWindows(nn.Module):
    """One attention layer whose heads see windows of their own, keys that are padding left out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.qkv = nn.Linear(32, 96)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        q, k, v = (z.view(b, t, HEADS, 8).transpose(1, 2) for z in self.qkv(self.embed(ids)).split(32, -1))
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        window = torch.tensor(WINDOWS)[:, None, None]
        keep = ((j <= i) & (i - j < window))[None] & (ids != 0)[:, None, None, :]  # (B, H, T, T)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep).sum()


@pytest.fixture(scope="module", params=[1, N], ids=lambda b: f"batch {b}")
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    torch.manual_seed(0)
    model = HeadWindows().eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    for a, p in enumerate(PADS):
        ids[a, :p] = 0
    call = caught_call(lambda: model(ids))
    kept = call["kept"]
    assert not (kept == kept[:, :1]).all() and not (kept == kept[:1]).all()  # heads differ, and samples
    out = tmp_path_factory.mktemp("heads") / "s.h5"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=request.param)
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
    return {"stored": stored, "expected": reference(call, 1), "said": [str(w.message) for w in said]}


def test_the_summary_says_it_started_again_streamed(summarised: dict[str, Any]) -> None:
    assert any("masked its heads differently as well as its samples" in w and "started again" in w
               for w in summarised["said"])  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_each_head_s_own_cells_of_each_sample_count_for_it(summarised: dict[str, Any], name: str) -> None:
    got, want = summarised["stored"][name], summarised["expected"][name]
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5, equal_nan=True)
