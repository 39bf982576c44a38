"""Packing matrices for the page (:mod:`biasviz.explorer.encode`), read back as explorer.js reads them: exact packing
bit for bit, quantised values within half a step."""

from __future__ import annotations

import numpy as np

from biasviz.explorer.encode import NAN_CODE, pack_exact, pack_quantised, quantise
from tests.explorer.test_build import unpack


def test_exact_packing_round_trips_bit_for_bit_and_a_toeplitz_bias_packs_to_almost_nothing() -> None:
    rng = np.random.default_rng(1)
    m = np.tril(rng.normal(size=(200, 200))).astype(np.float32)
    m[np.triu_indices(200, 1)] = np.nan
    got = unpack(pack_exact(m).as_json())
    assert np.array_equal(got.view(np.uint32), m.view(np.uint32))
    d = np.subtract.outer(np.arange(512), np.arange(512))
    alibi = np.where(d >= 0, -0.0625 * d, np.nan).astype(np.float32)
    packed = pack_exact(alibi)
    assert packed.toeplitz and packed.nbytes < 4000  # 1 MB of float32
    assert np.array_equal(unpack(packed.as_json()), alibi, equal_nan=True)


def test_quantised_values_are_within_half_a_step() -> None:
    m = np.random.default_rng(2).normal(size=(64, 64)).astype(np.float32)
    m[0, 5] = np.nan
    spec = pack_quantised(m).as_json()
    got = unpack(spec)
    assert np.isnan(got[0, 5]) and quantise(m)[0][0, 5] == NAN_CODE
    ok = np.isfinite(m)
    assert np.max(np.abs(got[ok] - m[ok])) <= spec["step"] / 2 * 1.0001
