"""HDF5 format 1 (README, "The HDF5 file"): layout, attributes, masking, atomic publication, clear errors."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from biasviz.common.errors import BiasvizError
from biasviz.store import REQUIRED_ATTRS, BiasFileWriter, open_bias_file
from tests.store.small_files import H, T, _attrs, _write


def test_layout_dims_chunks_compression(tmp_path):
    path = tmp_path / "f.h5"
    _write(path, layers=(0, 1))
    with h5py.File(path, "r") as f:
        assert set(f) >= {"input_ids", "layer_0", "layer_1"}
        assert f["input_ids"].dtype == np.int32 and f["input_ids"].shape == (2, T)
        assert [d.label for d in f["input_ids"].dims] == ["sample", "query"]
        for kind in ("bias", "weights"):
            ds = f[f"layer_1/{kind}"]
            assert ds.shape == (2, H, T, T)
            assert [d.label for d in ds.dims] == ["sample", "head", "query", "key"]
            assert ds.chunks == (1, 1, T, T)  # one (sample, head) matrix per chunk
            assert ds.compression == "gzip"
            assert list(ds.dims[1][0][()]) == list(range(1, H + 1))  # heads numbered as in the figures
            assert list(ds.dims[3][0][()]) == list(range(T))


def test_every_attribute_round_trips_as_data(tmp_path):
    path = tmp_path / "f.h5"
    _write(path)
    expected = _attrs()
    with open_bias_file(path) as f:
        a = f.attrs
        for key, value in expected.items():
            assert a[key] == value, key
            assert type(a[key]) is type(value), key  # bool stays bool, str stays str, int stays int
        assert set(REQUIRED_ATTRS) <= set(a)
        assert a["layers"] == [1] and a["samples"] == 2 and a["dtype"] == "float32"
        assert a["n_heads"] == H and a["seq_len"] == T and a["biasviz_format"] == 1 and a["causal"] is True
        assert json.loads(a["config_json"]) == {"n_head": H, "scheme": "alibi"}
        assert f.scheme == "alibi" and f.layers == [1] and f.n_heads == H and f.seq_len == T and f.n_samples == 2
        assert f.has_bias() and not f.context_dependent
    with h5py.File(path, "r") as raw:  # nothing is stored as an object (pickle) type
        for value in raw.attrs.values():
            assert not (isinstance(value, np.ndarray) and value.dtype == object)


def test_masking_values_and_caller_arrays_untouched(tmp_path):
    path = tmp_path / "f.h5"
    ids, weights, bias = _write(path)
    before = bias[1].copy()
    upper = np.triu(np.ones((T, T), bool), k=1)
    with open_bias_file(path) as f:
        b, w = f.read("bias", 1), f.read("weights", 1)
        assert np.isnan(b[..., upper]).all() and (w[..., upper] == 0).all()
        np.testing.assert_array_equal(b[..., ~upper], bias[1][..., ~upper])
        np.testing.assert_array_equal(w[..., ~upper], weights[1][..., ~upper])
        np.testing.assert_array_equal(f.input_ids(), ids)
        assert f.read("bias", 1, sample=1).shape == (H, T, T)
        assert len(list(f.iter_samples("weights"))) == 2
    np.testing.assert_array_equal(bias[1], before)  # the writer masks a copy, never the caller's tensor


def test_context_independent_bias_is_broadcast(tmp_path):
    path = tmp_path / "f.h5"
    _, _, bias = _write(path, n=3, bias_batch=1)
    with open_bias_file(path) as f:
        b = f.read("bias")
    assert b.shape == (3, H, T, T)
    for s in range(3):
        np.testing.assert_array_equal(np.tril(b[s]), np.tril(bias[1][0]))


def test_bidirectional_files_keep_every_cell(tmp_path):
    path = tmp_path / "f.h5"
    _, weights, _ = _write(path, causal=False)
    with open_bias_file(path) as f:
        assert not f.causal
        np.testing.assert_array_equal(f.read("weights", 1), weights[1])


def test_a_layer_keeps_its_own_rule_where_the_model_s_calls_differ(tmp_path):
    """An encoder-decoder's decoder self-attention is causal beside calls that see every key: its group says so, its
    cells past the query are NaN in the bias and 0 in the weights (whatever was passed), and read back by that rule;
    the file's other layers keep every cell, where a NaN is still damage."""
    rng = np.random.default_rng(0)
    bias = {layer: rng.normal(size=(2, H, T, T)).astype(np.float32) for layer in (0, 1)}
    weights = {layer: rng.random((2, H, T, T)).astype(np.float32) for layer in (0, 1)}
    above = np.triu(np.ones((T, T), dtype=bool), 1)
    bias[1][..., above] = np.nan  # the decoder call masked them
    args = {"attrs": _attrs(), "n_samples": 2, "n_heads": H, "seq_len": T, "layers": [0, 1], "has_bias": True,
            "causal": False}  # fmt: skip
    with BiasFileWriter(tmp_path / "f.h5", **args, layer_causal={0: False, 1: True}) as w:
        w.write_batch(np.zeros((2, T)), weights, bias)
    with h5py.File(tmp_path / "f.h5") as f:
        assert dict(f["layer_1"].attrs) == {"causal": True} and "causal" not in f["layer_0"].attrs
        np.testing.assert_array_equal(f["layer_1/weights"][...], np.where(above, 0.0, weights[1]))
        np.testing.assert_array_equal(f["layer_0/bias"][...], bias[0])
    with open_bias_file(tmp_path / "f.h5") as f:
        assert not f.causal and (f.layer_causal(0), f.layer_causal(1)) == (False, True)
        np.testing.assert_array_equal(f.read("bias", 1), bias[1])
    with pytest.raises(BiasvizError, match="bias of layer 1 contains NaN"), BiasFileWriter(
            tmp_path / "g.h5", **args) as w:  # fmt: skip
        w.write_batch(np.zeros((2, T)), weights, bias)  # the same NaN where the layer's rule uses every cell


def test_torch_tensors_accepted(tmp_path):
    w = torch.rand(1, H, T, T)
    with BiasFileWriter(tmp_path / "t.h5", attrs=_attrs(), n_samples=1, n_heads=H, seq_len=T, layers=[0],
                        has_bias=False) as writer:  # fmt: skip
        writer.write_batch(torch.zeros(1, T, dtype=torch.long), {0: w})
    with open_bias_file(tmp_path / "t.h5") as f:
        np.testing.assert_array_equal(f.read("weights")[0], np.tril(w[0].numpy()))
        with pytest.raises(BiasvizError, match="no bias"):
            f.read("bias")


def test_float16_storage_and_overflow(tmp_path):
    _write(tmp_path / "h.h5", dtype="float16")
    with open_bias_file(tmp_path / "h.h5") as f:
        assert f.dataset("weights").dtype == np.float16 and f.read("weights").dtype == np.float32
    bias = np.full((1, H, T, T), -1e6, np.float32)  # beyond float16's 65504
    writer = BiasFileWriter(tmp_path / "o.h5", attrs=_attrs(), n_samples=1, n_heads=H, seq_len=T, layers=[0],
                            has_bias=True, dtype="float16")  # fmt: skip
    with pytest.raises(BiasvizError, match="float16"), writer as w:
        w.write_batch(np.zeros((1, T)), {0: np.zeros((1, H, T, T))}, {0: bias})
    assert not (tmp_path / "o.h5").exists()


def test_nan_in_used_cells_is_an_error(tmp_path):
    weights = np.zeros((1, H, T, T), np.float32)
    weights[0, 0, 3, 1] = np.nan
    writer = BiasFileWriter(tmp_path / "n.h5", attrs=_attrs(), n_samples=1, n_heads=H, seq_len=T, layers=[0],
                            has_bias=False)  # fmt: skip
    with pytest.raises(BiasvizError, match="NaN"), writer as w:
        w.write_batch(np.zeros((1, T)), {0: weights})
    assert list(tmp_path.iterdir()) == []


def test_existing_file_kept_unless_force(tmp_path):
    path = tmp_path / "f.h5"
    path.write_bytes(b"precious")
    with pytest.raises(BiasvizError, match="--force"):
        _write(path)
    assert path.read_bytes() == b"precious"
    _write(path, force=True)
    with open_bias_file(path) as f:
        assert f.n_samples == 2


def test_error_midway_leaves_nothing_and_keeps_old_file(tmp_path):
    path = tmp_path / "f.h5"
    path.write_bytes(b"old")
    writer = BiasFileWriter(path, attrs=_attrs(), n_samples=4, n_heads=H, seq_len=T, layers=[0], has_bias=False,
                            force=True)  # fmt: skip
    with pytest.raises(KeyboardInterrupt), writer as w:
        w.write_batch(np.zeros((2, T)), {0: np.zeros((2, H, T, T))})
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.h5"]


def test_incomplete_file_is_not_published(tmp_path):
    writer = BiasFileWriter(tmp_path / "f.h5", attrs=_attrs(), n_samples=3, n_heads=H, seq_len=T, layers=[0],
                            has_bias=False)  # fmt: skip
    with pytest.raises(BiasvizError, match="only 1 of 3"), writer as w:
        w.write_batch(np.zeros((1, T)), {0: np.zeros((1, H, T, T))})
    assert list(tmp_path.iterdir()) == []


def test_lzf_and_uncompressed_settings_still_write_through_h5py(tmp_path):
    for filters in ({"compression": "lzf", "compression_opts": None}, {"compression": None}):
        path = tmp_path / f"{filters['compression']}.h5"
        _, weights, _ = _write(path, **filters)
        with h5py.File(path, "r") as f:
            assert f["layer_1/weights"].compression == filters["compression"]
            got = f["layer_1/weights"][()]
        np.testing.assert_array_equal(got, np.where(np.tril(np.ones((T, T), bool)), weights[1], 0.0))
