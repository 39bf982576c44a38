"""Each sample's distance profile and its standard error against numpy, cell by cell: causal and bidirectional calls,
rows in blocks, and samples whose blocks bring cells of their own after samples whose blocks brought none (the
counts come from each block: nothing is switched part-way)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.sample_profiles import SampleProfiles


def _reference_se(values: np.ndarray, masks: np.ndarray, causal: bool) -> np.ndarray:
    """values (N, H, T, T), masks (N, T, T) bool -> the SE over samples of each sample's mean at each i - j (causal:
    d = 0 .. T - 1; else -(T - 1) .. T - 1), samples with no cell there left out, NaN below 3."""
    n, h, t, _ = values.shape
    offsets = range(t) if causal else range(-(t - 1), t)
    out = np.full((h, len(offsets)), np.nan)
    for c, d in enumerate(offsets):
        for head in range(h):
            means = []
            for a in range(n):
                cells = [values[a, head, i, i - d] for i in range(t) if 0 <= i - d < t and masks[a, i, i - d]]
                if cells:
                    means.append(np.mean(cells))
            if len(means) >= 3:
                x = np.array(means)
                out[head, c] = np.sqrt(((x - x.mean()) ** 2).sum() / (len(x) * (len(x) - 1)))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_profile_se_over_each_block_s_cells(causal: bool) -> None:
    """Samples 0-2 come in blocks that bring no cells (the causal triangle, or every cell); samples 3-5 bring their
    own (left padding of 0, 3 and 5 positions): every sample is counted over its own cells."""
    n, h, t, rows = 6, 2, 11, 4
    rng = np.random.default_rng(7)
    values = rng.normal(size=(n, h, t, t))
    plain = np.tril(np.ones((t, t), bool)) if causal else np.ones((t, t), bool)
    masks = np.stack([plain] * n)
    for a, pad in zip((3, 4, 5), (0, 3, 5), strict=True):
        masks[a, :, :pad] = False  # no query sees a padded key; the padded queries see nothing
        masks[a, :pad] = False
    profiles = SampleProfiles(samples=n, heads=h, seq_len=t, causal=causal, device=torch.device("cpu"))
    for first, own in ((0, False), (3, True)):
        for r0 in range(0, t, rows):
            r1 = min(t, r0 + rows)
            keys = r1 if causal else t
            block = torch.as_tensor(values[first : first + 3, :, r0:r1, :keys])
            cells = torch.as_tensor(masks[first : first + 3, None, r0:r1, :keys]) if own else None
            profiles.add(first, r0, block, cells)
    got = profiles.standard_error()
    assert got is not None
    np.testing.assert_allclose(got.numpy(), _reference_se(values, masks, causal), rtol=1e-10, equal_nan=True)
