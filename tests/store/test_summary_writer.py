"""Writing summary files (:mod:`biasviz.store.summary_writer`): the block-mean maps are gzip chunks, one per map,
that libhdf5 reads back, with and without checkpoints."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.store.small_files import _attrs


@pytest.mark.parametrize("checkpoints", [None, [10, 20]])
def test_summary_maps_are_gzip_chunks_per_map_that_libhdf5_reads_back(tmp_path, checkpoints):
    from types import SimpleNamespace

    from biasviz.store.summary_writer import write_summary_file

    t, block, heads = 600, 2, 3  # (3, 300, 300) float32 maps: over 1 MiB, so compressed
    nb = t // block
    rng = np.random.default_rng(1)
    parts = [SimpleNamespace(mean=rng.normal(size=(heads, nb, nb)).astype(np.float32),
                             std=rng.random((heads, nb, nb)).astype(np.float32),
                             profile=rng.normal(size=(2, heads, t)).astype(np.float32), diagnostics=None)
             for _ in range(len(checkpoints or [0]))]  # fmt: skip
    path = write_summary_file(tmp_path / "s.h5", attrs=_attrs(), input_ids=rng.integers(0, 50, (2, t)),
                              n_heads=heads, seq_len=t, resolution=nb, block=block, layers=[0],
                              summaries=[{0: {"weights": p}} for p in parts], checkpoints=checkpoints)  # fmt: skip
    lead = () if checkpoints is None else (1,)
    with h5py.File(path, "r") as f:  # decoded by libhdf5's deflate and shuffle filters, not ours
        for name, stat in (("weights_mean", "mean"), ("weights_std", "std")):
            ds = f[f"layer_0/{name}"]
            assert ds.compression == "gzip" and ds.shuffle and ds.chunks == (*lead, 1, nb, nb)
            want = np.stack([getattr(p, stat) for p in parts]) if checkpoints else getattr(parts[0], stat)
            np.testing.assert_array_equal(ds[()], want)
