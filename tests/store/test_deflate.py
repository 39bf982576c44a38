"""Chunks deflated by biasviz (:mod:`biasviz.store.deflate`: ISA-L or zlib, on one thread or several, shuffled or
not, float32 or float16) are what libhdf5's own deflate and shuffle filters decode."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.store.small_files import T, _write


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_parallel_gzip_chunks_read_back_through_hdf5s_own_filters(tmp_path, shuffle, workers, dtype):
    path = tmp_path / "f.h5"
    _, weights, bias = _write(path, n=3, bias_batch=1, shuffle=shuffle, workers=workers, dtype=dtype,
                              compression_opts=3)  # fmt: skip
    cells = np.tril(np.ones((T, T), dtype=bool))
    with h5py.File(path, "r") as f:  # decoded by libhdf5's deflate and shuffle filters, not ours
        ds_w, ds_b = f["layer_1/weights"], f["layer_1/bias"]
        assert ds_w.compression == "gzip" and ds_w.compression_opts == 3 and ds_w.shuffle == shuffle
        got_w, got_b = ds_w[()].astype(np.float32), ds_b[()].astype(np.float32)
    tol = 0 if dtype == "float32" else 1e-3
    want_w = np.where(cells, weights[1].astype(dtype).astype(np.float32), 0.0)
    np.testing.assert_allclose(got_w, want_w, atol=tol * 4, rtol=tol)
    for s in range(3):  # one (1, H, T, T) bias stored for every sample
        want_b = np.where(cells, bias[1][0].astype(dtype).astype(np.float32), np.nan)
        np.testing.assert_allclose(got_b[s], want_b, atol=tol * 4, rtol=tol)
