"""Summaries streamed over samples and row blocks equal the same statistics computed in one go with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries import QuantitySummary

N, H, T = 5, 3, 37


def _bias(seed: int = 0) -> np.ndarray:
    """(N, H, T, T) float32 with a structure (a distance term) plus per-sample noise."""
    rng = np.random.default_rng(seed)
    i, j = np.indices((T, T))
    base = -0.3 * (i - j)[None, None] * np.arange(1, H + 1)[None, :, None, None]
    return (base + rng.normal(size=(N, H, T, T))).astype(np.float32)


def _feed(x: np.ndarray, *, kind: str = "bias", block: int = 1, mode: str = "joint", batch: int = N,
          rows: tuple[int, ...] = (5, 1, 11, 20), causal: bool = True,
          samples: int | None = None) -> QuantitySummary:  # fmt: skip
    """Stream ``x`` as a causal model would: batches of samples, uneven blocks of query rows of width row1."""
    s = QuantitySummary(kind, 0, heads=H, seq_len=T, block=block, causal=causal, mode=mode,
                        device=torch.device("cpu"), samples=samples)  # fmt: skip
    for b0 in range(0, x.shape[0], batch):
        xb = torch.from_numpy(x[b0 : b0 + batch])
        s.begin_batch(xb.shape[0])
        r0, k = 0, 0
        while r0 < T:
            r1 = min(T, r0 + rows[k % len(rows)])
            keys = r1 if causal else T
            s.add(r0, xb[:, :, r0:r1, :keys].clone())
            r0, k = r1, k + 1
        s.end_batch()
    return s


def _masked(a: np.ndarray) -> np.ndarray:
    out = a.astype(np.float64).copy()
    out[..., ~np.tril(np.ones((T, T), bool))] = np.nan
    return out


def _block_means(cells: np.ndarray, b: int) -> np.ndarray:
    nb = -(-T // b)
    out = np.full((H, nb, nb), np.nan)
    for q in range(nb):
        for k in range(nb):
            part = cells[:, q * b : (q + 1) * b, k * b : (k + 1) * b].reshape(H, -1)
            if not np.isnan(part).all():
                out[:, q, k] = np.nanmean(part, axis=1)
    return out


@pytest.mark.parametrize(("mode", "batch"), [("joint", N), ("cells", 2), ("cells", 1)])
def test_maps_at_full_resolution_are_the_mean_and_std_over_samples(mode: str, batch: int) -> None:
    x = _bias()
    r = _feed(x, mode=mode, batch=batch).result()
    np.testing.assert_allclose(r.mean, _masked(x.mean(0, dtype=np.float64)), rtol=1e-6, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(r.std, _masked(x.astype(np.float64).std(0)), rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("block", [2, 4, 10, 37])
def test_pooled_blocks_are_block_means_of_the_full_maps(block: int) -> None:
    x = _bias(1)
    r = _feed(x, block=block).result()
    want_mean = _block_means(_masked(x.mean(0, dtype=np.float64)), block)
    want_std = _block_means(_masked(x.astype(np.float64).std(0)), block)
    assert r.mean.shape == (H, -(-T // block), -(-T // block))
    np.testing.assert_allclose(r.mean, want_mean, rtol=1e-5, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(r.std, want_std, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_profile_against_plain_numpy() -> None:
    x = _bias(3)
    r = _feed(x, kind="weights").result()
    assert r.diagnostics is None
    for d in (0, 1, 17, T - 1):
        cells = np.stack([x[:, :, i, i - d] for i in range(d, T)], axis=-1).astype(np.float64)  # (N, H, T - d)
        np.testing.assert_allclose(r.profile[0, :, d], cells.mean(axis=(0, 2)), rtol=1e-6)
        np.testing.assert_allclose(r.profile[1, :, d], cells.std(axis=(0, 2)), rtol=1e-5, atol=1e-7)


def test_bidirectional_maps_use_every_cell() -> None:
    x = _bias(6)
    r = _feed(x, causal=False, block=4).result()
    want = _block_means(x.mean(0, dtype=np.float64), 4)
    np.testing.assert_allclose(r.mean, want, rtol=1e-5, atol=1e-6)


def test_non_finite_values_in_used_cells_are_refused() -> None:
    x = _bias()
    x[0, 1, 20, 3] = np.nan
    with pytest.raises(Exception, match="NaN or infinite"):
        _feed(x).result()


@pytest.mark.parametrize(("batch", "store"), [(N, "joint"), (2, "cells")])
def test_a_shared_bias_that_differs_part_way_ends_shared_once_and_keeps_its_store(batch: int, store: str) -> None:
    """Declared shared, the same in every sample but the fourth from row 20 on: summarised once until then, per sample
    from the first difference (its spread numpy's over every sample), and the part says so: no longer shared, its
    samples meeting block by block in one batch or per cell over several; ``mode`` reads it back and is not set.
    (A part told how many samples come keeps the first's rows only where later batches are to be compared.)"""
    x = np.broadcast_to(_bias()[:1], (N, H, T, T)).copy()
    x[3, :, 20:] += 0.5
    s = _feed(x, mode="shared", batch=batch, samples=N)
    assert (s.shared, s.store, s.mode) == (False, store, store)
    assert s.difference == pytest.approx(0.5)
    r = s.result()
    np.testing.assert_allclose(r.mean, _masked(x.mean(0, dtype=np.float64)), rtol=1e-6, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(r.std, _masked(x.astype(np.float64).std(0)), rtol=1e-6, atol=1e-6, equal_nan=True)
    with pytest.raises(AttributeError):
        s.mode = "shared"  # type: ignore[misc]


def test_a_shared_bias_measured_equal_stays_shared_and_stops_when_samples_bring_their_own_cells() -> None:
    x = np.broadcast_to(_bias()[:1], (N, H, T, T)).copy()
    s = _feed(x, mode="shared", batch=2)
    assert (s.shared, s.mode, s.difference) == (True, "shared", 0.0)
    s.stop_comparing()  # each sample over its own cells: summarised per sample, no longer compared
    assert (s.shared, s.store, s.difference) == (False, "cells", None)
