"""Joining format-1 files (:func:`biasviz.store.combine.combine`), as torchrun's shards are joined: the joined file
keeps its parts' compression and holds the values of a one-process run; shards whose shared biases differ are
joined per sample."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.run import extract
from biasviz.store import open_bias_file
from biasviz.store.format import BIAS_DIFFERENCE
from tests.conftest import small_model
from tests.store.test_compression import CHOICES, T, TwoHeads, _reference
from tests.store.test_shared_bias import _secretly_dependent, _windows


@pytest.mark.parametrize("choice", ["lzf", "none", "gzip:9"])
def test_joined_parts_keep_their_compression(tmp_path: Path, choice: str) -> None:
    """What torchrun's shards become (store.combine): the joined file has the parts' filter and the one-run values."""
    from biasviz.store.combine import combine

    model = TwoHeads()
    ids = np.random.default_rng(3).integers(0, 50, (4, T))
    parts = [tmp_path / "a.h5", tmp_path / "b.h5"]
    for part, rows in zip(parts, (ids[:2], ids[2:]), strict=True):
        biasviz.extract(model, rows, part, device="cpu", progress=False, compression=choice)
    combine(parts, tmp_path / "joined.h5", along="sample")
    with h5py.File(tmp_path / "joined.h5", "r") as f:
        ds = f["layer_0/weights"]
        assert ds.compression == CHOICES[choice][0] and ds.compression_opts == CHOICES[choice][1]
        np.testing.assert_allclose(ds[()], _reference(model, ids), rtol=1e-5, atol=1e-6)


def test_torchrun_shards_whose_shared_biases_differ_are_joined_per_sample(tmp_path: Path) -> None:
    """Each process measured its own samples equal; the join measures the processes' against each other."""
    from biasviz.store.combine import combine

    ids = _windows(4)
    honest = BiasGPTAdapter(small_model("alibi"), source="test")
    secret = BiasGPTAdapter(_secretly_dependent(small_model("alibi")), source="test")
    extract(honest, ids[:2], tmp_path / "a.h5", device="cpu", progress=False, batch_size=2)
    extract(secret, ids[2:3], tmp_path / "b.h5", device="cpu", progress=False)  # one sample: nothing to compare
    extract(honest, ids[2:], tmp_path / "c.h5", device="cpu", progress=False, batch_size=2)
    combine([tmp_path / "a.h5", tmp_path / "c.h5"], tmp_path / "same.h5", along="sample")
    combine([tmp_path / "a.h5", tmp_path / "b.h5"], tmp_path / "joined.h5", along="sample")
    with open_bias_file(tmp_path / "same.h5") as f:
        assert f.bias_shared and f.attrs[BIAS_DIFFERENCE] == 0.0
    with open_bias_file(tmp_path / "joined.h5") as f, open_bias_file(tmp_path / "b.h5") as b:
        assert not f.bias_shared and f.attrs[BIAS_DIFFERENCE] > 0
        bias = f.read("bias")
        assert bias.shape[0] == 3
        np.testing.assert_array_equal(bias[2], b.read("bias", sample=0))
        np.testing.assert_array_equal(bias[0], bias[1])
