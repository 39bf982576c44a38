"""A bidirectional model's diagnostics over every cell (docs/hdf5.md, 'Attended cells'), in full files and summaries
alike.

The reference is plain float64 numpy on the bias the model itself hands to its attention call, over all T x T
cells: the spread of the mean bias, the Toeplitz residual along the 2T - 1 signed diagonals, and the separability
residual of the least-squares s_i - s_j over every pair i != j, solved as an explicit least-squares problem.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import biasviz
from biasviz.cli import main

HEADS, T, WIDTH, VOCAB, SAMPLES = 2, 12, 8, 32, 3


class Encoder(torch.nn.Module):
    """One bidirectional attention call whose additive bias is neither Toeplitz nor separable, and moves with the
    input (a per-key term from the tokens)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, HEADS * WIDTH)
        self.base = torch.nn.Parameter(torch.randn(HEADS, T, T, generator=g))
        self.key_term = torch.nn.Embedding(VOCAB, HEADS)

    def bias(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, H, T, T): what the attention call receives."""
        return self.base[None] + 0.3 * self.key_term(ids).permute(0, 2, 1)[:, :, None, :]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = ids.shape[0]
        x = self.embed(ids).view(b, T, HEADS, WIDTH).transpose(1, 2)
        return F.scaled_dot_product_attention(x, x, x, attn_mask=self.bias(ids))


def reference(bias: np.ndarray) -> np.ndarray:
    """(H, 3): context dependence, Toeplitz and separability residuals over every cell, float64."""
    mean = bias.mean(0)  # (H, T, T)
    i, j = np.indices((T, T))
    pairs = [(a, c) for a in range(T) for c in range(T) if a != c]
    design = np.zeros((len(pairs), T))
    for row, (a, c) in enumerate(pairs):
        design[row, a], design[row, c] = 1.0, -1.0
    out = []
    for h in range(HEADS):
        m = mean[h]
        spread = m.std()
        dependence = bias[:, h].std(0).mean() / spread
        diag_mean = {d: m[i - j == d].mean() for d in range(-T + 1, T)}
        toeplitz = np.sqrt(np.mean([(m[a, c] - diag_mean[a - c]) ** 2 for a in range(T) for c in range(T)]))
        s = np.linalg.lstsq(design, np.array([m[a, c] for a, c in pairs]), rcond=None)[0]
        residual = m - (s[:, None] - s[None, :])  # the diagonal's residual is b(i, i) whatever s
        out.append([dependence, toeplitz / spread, np.sqrt(np.mean(residual**2)) / spread])
    return np.array(out)


@pytest.fixture(scope="module")
def model_and_ids() -> tuple[Encoder, torch.Tensor, np.ndarray]:
    torch.manual_seed(0)
    model = Encoder().eval()
    ids = torch.randint(0, VOCAB, (SAMPLES, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        bias = model.bias(ids).double().numpy()
    return model, ids, reference(bias)


def test_a_summary_measures_a_bidirectional_bias_over_every_cell(model_and_ids, tmp_path: Path) -> None:
    model, ids, expected = model_and_ids
    biasviz.extract(model, ids, tmp_path / "s.h5", summary=True, progress=False)
    with h5py.File(tmp_path / "s.h5", "r") as f:
        layer = next(k for k in f if k.startswith("layer_"))
        got = f[layer]["diagnostics"][()]
    measured = np.array([[row[k] for k in range(3)] for row in got])
    np.testing.assert_allclose(measured, expected, rtol=1e-5)


def test_diagnose_of_a_full_file_agrees_over_every_cell(model_and_ids, tmp_path: Path) -> None:
    model, ids, expected = model_and_ids
    biasviz.extract(model, ids, tmp_path / "f.h5", progress=False)
    main(["diagnose", str(tmp_path / "f.h5"), "--no-figures", "--json", str(tmp_path / "d.json")])
    heads = next(iter(json.loads((tmp_path / "d.json").read_text())["schemes"].values()))["heads"]
    measured = np.array([[h["context_dependence"], h["toeplitz_residual"], h["separability_residual"]]
                         for h in heads])  # fmt: skip
    np.testing.assert_allclose(measured, expected, rtol=1e-5)
