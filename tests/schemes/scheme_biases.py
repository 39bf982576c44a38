"""A scheme's bias computed for the tests of tests/schemes, and the cells and distances its definition speaks of."""

from __future__ import annotations

import numpy as np
import torch

from biasviz.schemes import SCHEMES, get_scheme

H = 12

T = 40

WIDTH = 16


def causal_distance(t: int) -> np.ndarray:
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    return (i - j).astype(np.float64)


def causal_cells(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


def scheme_bias(name: str, x: torch.Tensor | None = None, t: int = T, **options: object) -> np.ndarray:
    torch.manual_seed(0)
    scheme = get_scheme(name)(H, 48, **options)
    with torch.no_grad():
        return scheme(x, t, t).double().numpy()


def _bias(name: str, h: int, t: int, b: int, seed: int, threshold: float | None = None) -> torch.Tensor:
    """The bias of a scheme with random (valid) parameters; FIRE's threshold L fixed to ``threshold``."""
    torch.manual_seed(seed)
    scheme = SCHEMES[name](h, WIDTH)
    with torch.no_grad():
        for p in scheme.parameters():  # random parameters, within the valid range
            p.copy_(torch.rand_like(p) * 1.5 + 0.05 if p.dim() <= 1 else torch.randn_like(p))
        if threshold is not None:
            scheme.threshold.fill_(threshold)
        scheme.constrain_()
        return scheme.bias(torch.randn(b, t, WIDTH), t, t).double()
