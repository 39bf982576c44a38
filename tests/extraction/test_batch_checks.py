"""Full files of calls whose own mask removes cells the rule keeps (padding, a sliding window): the bias or scores
there would be the mask, so they are refused with what to do instead; the weights alone are stored as the model
formed them, compared here with transformers' own ``output_attentions``."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.common.errors import BiasvizError

T, V = 24, 64


@pytest.fixture(scope="module")
def bloom() -> torch.nn.Module:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    return BloomForCausalLM(BloomConfig(vocab_size=V, hidden_size=32, n_layer=1, n_head=4)).eval()


def padded_ids() -> np.ndarray:
    ids = np.random.default_rng(0).integers(1, V, size=(3, T))
    for a in range(3):
        ids[a, : 5 * a] = 0  # token 0 pads the first 0, 5 and 10 positions
    return ids


def test_a_padded_call_s_bias_is_refused_in_a_full_file_and_its_weights_are_stored_as_formed(bloom, tmp_path):
    ids = padded_ids()

    def forward(batch: torch.Tensor) -> object:
        return bloom(batch, attention_mask=(batch != 0).long())

    out = tmp_path / "f.h5"
    with pytest.raises(BiasvizError, match="masks cells of its own within the causal triangle.*extract --summary"):
        biasviz.extract(bloom, ids, out, progress=False, forward=forward, batch_size=3)
    assert not out.exists()  # nothing published
    biasviz.extract(bloom, ids, out, progress=False, forward=forward, batch_size=3, capture="weights")
    with torch.no_grad():
        x = torch.as_tensor(ids)
        want = bloom(x, attention_mask=(x != 0).long(), output_attentions=True).attentions[0].numpy()
    causal = np.tril(np.ones((T, T), dtype=bool))
    with h5py.File(out) as f:
        got = f["layer_0/weights"][()]
    np.testing.assert_allclose(got[..., causal], want[..., causal], rtol=1e-5, atol=1e-6)


def test_unpadded_samples_keep_their_bias(bloom, tmp_path):
    ids = np.random.default_rng(1).integers(1, V, size=(2, T))
    biasviz.extract(bloom, ids, tmp_path / "f.h5", progress=False, batch_size=2)
    with h5py.File(tmp_path / "f.h5") as f:
        assert np.isfinite(f["layer_0/bias"][0][..., np.tril(np.ones((T, T), dtype=bool))]).all()
