"""A bias a traced call added, held in its smallest form (:mod:`biasviz.adapters.kept_bias`): a row of keys, a table
of j - i, or cell by cell, against biases written out cell by cell with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.kept_bias import KeptBias, added_bias
from tests.adapters.test_kept_calls import H, T, _ops


def test_the_added_bias_is_the_float_mask_over_the_cells_attended_and_0_elsewhere() -> None:
    rng = np.random.default_rng(1)
    values = rng.standard_normal((1, H, T, T)).astype(np.float32)
    causal = np.tril(np.ones((T, T), bool))
    mask = np.where(causal, values, -np.inf).astype(np.float32)
    ops = _ops(np.broadcast_to(causal, (2, 1, T, T)).copy())
    ops.additive = torch.from_numpy(mask)
    got = added_bias(ops).numpy()
    assert got.shape == (2, H, T, T) and np.array_equal(got[1], np.where(causal, values[0], 0.0))
    ops.additive = None  # a call that adds none: 0 everywhere
    assert not added_bias(ops).any()


def _biases(kind: str, causal: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """(1, H, T, T) float32 bias written out cell by cell, 0 where not attended, its mask, and the form it has."""
    rng = np.random.default_rng(3)
    i, j = np.indices((T, T))
    slopes = np.array([0.5, 0.25, 0.125])[:, None, None]
    kept = np.broadcast_to(j <= i if causal else np.ones((T, T), bool), (1, 1, T, T))
    if kind == "alibi":  # -m·(i - j): a function of the offset
        values, form = -slopes * (i - j), "offset"
    elif kind == "key":  # m·j, BLOOM's: a function of the key
        values, form = slopes * j, "key"
    elif kind == "buckets":  # T5-like, a value per bucket of j - i on both sides
        table = rng.normal(size=(H, 2 * T - 1))
        values, form = table[:, j - i + T - 1], "offset"
    else:  # a value per cell
        values, form = rng.normal(size=(H, T, T)), "cells"
    bias = np.where(kept, values[None], 0).astype(np.float32)
    return bias, kept.copy(), form


@pytest.mark.parametrize("kind", ["alibi", "key", "buckets", "cells"])
@pytest.mark.parametrize("causal", [True, False])
def test_a_bias_is_held_in_its_smallest_form_and_gives_every_attended_cell_back(kind: str, causal: bool) -> None:
    bias, kept, form = _biases(kind, causal)
    held = KeptBias.of(torch.from_numpy(bias), torch.from_numpy(kept))
    assert held.form == form
    assert held.values.numel() <= {"key": H * T, "offset": H * (2 * T - 1), "cells": H * T * T}[form]
    for r0, r1, keys in ((0, T, T), (2, 5, 5), (3, 4, T), (5, 6, 6)):
        got = torch.where(torch.from_numpy(kept[..., r0:r1, :keys]), held.rows(r0, r1, keys), 0.0).numpy()
        assert np.array_equal(got, bias[..., r0:r1, :keys]), (r0, r1, keys)  # exactly the values the call added
    assert held.fits(torch.from_numpy(np.repeat(bias, 2, 0)), torch.from_numpy(kept))
    assert held.take(torch.from_numpy(np.repeat(bias, 2, 0)), torch.from_numpy(kept))


@pytest.mark.parametrize("kind", ["alibi", "key", "buckets"])
def test_a_bias_one_cell_off_its_form_is_held_cell_by_cell_and_a_later_one_off_by_one_ulp_is_not_the_same(
        kind: str) -> None:  # fmt: skip
    bias, kept, _ = _biases(kind, causal=True)
    off = bias.copy()
    off[0, 1, 4, 2] += 1.0
    assert KeptBias.of(torch.from_numpy(off), torch.from_numpy(kept)).form == "cells"
    held = KeptBias.of(torch.from_numpy(bias), torch.from_numpy(kept))
    later = np.repeat(bias, 2, 0)
    later[1, 2, 5, 1] = np.nextafter(later[1, 2, 5, 1], np.float32(np.inf))
    assert not held.take(torch.from_numpy(later), torch.from_numpy(kept))
    assert not held.fits(torch.from_numpy(later), torch.from_numpy(kept))


@pytest.mark.parametrize("kind", ["alibi", "key", "buckets", "cells"])
def test_a_padded_sample_shows_part_of_the_bias_and_a_later_one_fills_in_the_rest(kind: str) -> None:
    """Left padding: the first sample attends no key before 3, so its cells show only part of the form; a later
    unpadded sample shows the rest, which is taken in where it agrees with what was shown, and then gives every cell
    back. One that disagrees on a value both showed is refused."""
    bias, kept, form = _biases(kind, causal=True)
    padded = kept & (np.arange(T) >= 3)
    first = np.where(padded, bias, 0).astype(np.float32)
    held = KeptBias.of(torch.from_numpy(first), torch.from_numpy(padded))
    if form != "cells":
        assert held.form == form
        assert not bool(held.seen.all())
    assert held.take(torch.from_numpy(bias), torch.from_numpy(kept))
    got = torch.where(torch.from_numpy(kept), held.rows(0, T, T), 0.0).numpy()
    assert np.array_equal(got, bias)
    other = bias.copy()
    other[0, 0, 5, 4] -= 1.0  # a cell both samples attend
    fresh = KeptBias.of(torch.from_numpy(first), torch.from_numpy(padded))
    assert not fresh.take(torch.from_numpy(other), torch.from_numpy(kept))


def test_a_window_s_cells_outside_it_say_nothing_of_the_form() -> None:
    """Masked cells hold 0 whatever the form would give them: they take no part in finding it."""
    i, j = np.indices((T, T))
    kept = ((j <= i) & (i - j < 3))[None, None]
    bias = np.where(kept, -0.5 * (i - j), 0).astype(np.float32)
    held = KeptBias.of(torch.from_numpy(bias), torch.from_numpy(kept))
    assert held.form == "offset" and held.values.shape[-1] == 2 * T - 1
