"""The forms of a bias the fused kernels add (:mod:`biasviz.summaries.kernels.biases`), against float64 numpy formed
cell by cell: FIRE's MLP from its scheme's own parameters, each sample's ends e(i) - e(j) and each sample's row of
keys. These are plain tensors: nothing here needs Triton."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.schemes import get_scheme
from biasviz.summaries.kernels.biases import CellBias, KeyBias, MlpBias, SampleEnds, SampleKeys, mlp_bias

HEADS, T = 3, 11


def _fire_cells(scheme: torch.nn.Module, t: int) -> np.ndarray:
    """(H, T, T) float64 FIRE's b_h(i, j) = MLP(log(c d + 1) / log(c max(L, i) + 1)) on the causal cells (Li et al.)."""
    c, big_l = float(scheme.c.detach()), float(scheme.threshold.detach())
    i, j = np.indices((t, t)).astype(np.float64)
    u = np.log(c * np.clip(i - j, 0, None) + 1) / np.log(c * np.maximum(big_l, i) + 1)
    w1, b1 = (p.detach().double().numpy() for p in (scheme.mlp[0].weight, scheme.mlp[0].bias))
    w2, b2 = (p.detach().double().numpy() for p in (scheme.mlp[2].weight, scheme.mlp[2].bias))
    return np.moveaxis(np.maximum(u[..., None] * w1[:, 0] + b1, 0) @ w2.T + b2, -1, 0)


def _mlp_cells(terms: MlpBias, t: int) -> np.ndarray:
    """(H, T, T) float64 the MLP formed from ``terms`` alone, as the docstring of :class:`MlpBias` reads."""
    psi_d, psi_i, w1, b1, w2, b2 = (x.double().numpy() for x in terms)
    i, j = np.indices((t, t))
    u = psi_d[np.clip(i - j, 0, None)] / psi_i[i]
    return np.moveaxis(np.maximum(u[..., None] * w1 + b1, 0) @ w2.T + b2, -1, 0)


@pytest.mark.parametrize("threshold", [4.0, 512.0])  # L inside T (rows i >= L interpolate) and beyond it
def test_fire_s_terms_form_its_bias_as_the_paper_writes_it(threshold: float) -> None:
    torch.manual_seed(1)
    scheme = get_scheme("fire")(HEADS, 24, init_threshold=threshold, init_c=0.3)
    terms = mlp_bias(scheme, T)
    assert isinstance(terms, MlpBias)
    causal = np.tril(np.ones((T, T), dtype=bool))
    want = _fire_cells(scheme, T)
    np.testing.assert_allclose(_mlp_cells(terms, T)[:, causal], want[:, causal], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(terms.first().numpy(), want[:, 0, 0], rtol=1e-6, atol=1e-7)
    hidden = terms.w1.numel()
    packed = terms.packed(torch.device("cpu"))  # [ψ(d), ψ(max(L, i)), w1, b1, w2 by rows, b2]
    assert packed.dtype == torch.float32 and packed.shape == (2 * T + 2 * hidden + HEADS * hidden + HEADS,)
    w2 = packed[2 * T + 2 * hidden : 2 * T + 2 * hidden + HEADS * hidden].view(HEADS, hidden)
    assert torch.equal(w2, terms.w2.float()) and torch.equal(packed[-HEADS:], terms.b2.float())
    assert torch.equal(packed[T : 2 * T], terms.psi_i.float())


def test_only_a_bias_of_the_distance_the_same_for_every_input_is_an_mlp() -> None:
    assert mlp_bias(get_scheme("alibi")(HEADS, 24), T) is None  # no MLP
    scheme = get_scheme("fire")(HEADS, 24)
    scheme.context_dependent = True  # an MLP whose bias differs by input: no one table of weights for every sample
    assert mlp_bias(scheme, T) is None


def test_a_row_of_keys_and_cells_give_their_first_cell() -> None:
    values = torch.randn(HEADS, T, T, dtype=torch.float64)
    assert torch.equal(CellBias(values).first(), values[:, 0, 0])
    assert CellBias(values).packed(torch.device("cpu")).dtype == torch.float32
    keys = torch.randn(HEADS, T)
    assert torch.equal(KeyBias(keys).first(), keys[:, 0].double())


def _ends_cells(e: np.ndarray) -> np.ndarray:
    """(N, H, T, T) float64 b_a(i, j) = e_a(i) - e_a(j), 0 above the diagonal."""
    cells = e[..., :, None] - e[..., None, :]
    return np.where(np.tril(np.ones(cells.shape[-2:], dtype=bool)), cells, 0.0)


@pytest.mark.parametrize("block", [1, 3, 4, T])  # a cell a block, blocks cut at T, one block
def test_each_sample_s_ends_sum_by_block_as_its_cells_do(block: int) -> None:
    rng = np.random.default_rng(block)
    e = -rng.random((2, HEADS, T)).cumsum(-1)  # CABLE's and FoX's ends: cumulative sums
    got = SampleEnds(torch.from_numpy(e)).block_sums(block).numpy()
    cells, nb = _ends_cells(e), -(-T // block)
    want = np.zeros((2, HEADS, nb, nb))
    for a in range(nb):
        for b in range(nb):
            want[..., a, b] = cells[..., a * block : (a + 1) * block, b * block : (b + 1) * block].sum((-2, -1))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("first_keys", [1, 4, T + 2])
def test_each_sample_s_ends_sum_by_distance_as_its_cells_do(first_keys: int) -> None:
    e = np.random.default_rng(first_keys).normal(size=(3, HEADS, T)).cumsum(-1)
    every, first = SampleEnds(torch.from_numpy(e)).distance_sums(first_keys)
    cells = _ends_cells(e)
    i, j = np.indices((T, T))
    for d in range(T):
        on = (i - j == d) & (j <= i)
        np.testing.assert_allclose(every[..., d].numpy(), cells[..., on].sum(-1), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(first[..., d].numpy(), cells[..., on & (j < first_keys)].sum(-1), rtol=1e-12,
                                   atol=1e-12)  # fmt: skip


def test_each_sample_s_ends_give_its_rows_and_their_mean_taken_in_float64() -> None:
    e = torch.randn(3, HEADS, T).cumsum(-1)
    ends = SampleEnds(e)
    rows = ends.rows(1, 4, 9)  # queries 4 .. 8 of sample 1 against keys 0 .. 8
    assert rows.shape == (1, HEADS, 5, 9)
    want = _ends_cells(e.double().numpy())[1, :, 4:9, :9]
    causal = np.tril(np.ones((T, T), dtype=bool), 0)[4:9, :9]
    np.testing.assert_allclose(rows[0].numpy()[:, causal], want[:, causal], rtol=1e-6, atol=1e-6)
    packed = ends.packed(torch.device("cpu"))  # each sample's ends, then their mean
    assert packed.shape == (4, HEADS, T) and torch.equal(packed[:3], e)
    assert torch.equal(packed[3], torch.from_numpy(e.double().numpy().mean(0)).float())
    assert torch.equal(ends.first(), torch.zeros(HEADS, dtype=torch.float64))


def test_each_sample_s_row_of_keys_reads_nan_as_never_read_and_its_mean() -> None:
    g = torch.randn(2, HEADS, T)
    g[1, :, :3] = float("nan")  # sample 1 attends no key 0 .. 2 (left padding)
    keys = SampleKeys(g)
    packed = keys.packed(torch.device("cpu"))
    assert packed.shape == (3, HEADS, T) and not packed.isnan().any()
    assert torch.equal(packed[1, :, :3], torch.zeros(HEADS, 3))
    np.testing.assert_allclose(packed[2].numpy(), np.nan_to_num(g.numpy()).mean(0), rtol=1e-6)
    np.testing.assert_allclose(keys.first().numpy(), np.nan_to_num(g[:, :, 0].double().numpy()).mean(0))
    rows = keys.rows(0, 2, 6)  # g_0(j) on every row
    assert rows.shape == (1, HEADS, 4, 6) and torch.equal(rows[0, :, 3], g[0, :, :6])
