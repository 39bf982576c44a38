"""Full files' layers (:mod:`biasviz.store.full_layout`): written with h5py (tests/summary_files.py), read back as
(sample, head, query, key) datasets whatever the file stores, and refused with one error where a layer is not what the
header says."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.store import open_bias_file
from tests.summary_files import alibi, weights_of, write_full

N, H, T = 3, 4, 8


def test_a_bias_stored_once_reads_as_every_samples_and_the_weights_as_written(tmp_path: Path) -> None:
    bias = alibi(N, H, T)
    weights = weights_of(bias)
    path = write_full(tmp_path / "f.h5", "alibi", bias[:1], weights, shared=True, layer=2)
    with open_bias_file(path) as f:
        assert f.dataset("bias", 2).shape == (N, H, T, T)
        np.testing.assert_array_equal(f.read("bias", 2), np.broadcast_to(bias[:1], (N, H, T, T)))
        np.testing.assert_array_equal(f.read("weights", 2, sample=1), weights[1])
        with pytest.raises(BiasvizError, match="holds no scores: extract with --capture bias,weights,scores"):
            f.dataset("scores", 2)


def test_what_a_file_without_a_bias_says(tmp_path: Path) -> None:
    path = write_full(tmp_path / "nope.h5", "nope", None, weights_of(alibi(N, H, T)), layer=0)
    with open_bias_file(path) as f, pytest.raises(BiasvizError, match="holds no bias \\(scheme 'nope' adds no bias\\)"):
        f.dataset("bias", 0)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda g: g.__delitem__("weights"), "lists layer 2 but has no layer_2/weights"),
    (lambda g: g.__delitem__("bias") or g.create_dataset("bias", data=np.zeros((N, H, T, T - 1), np.float32)),
     r"layer_2/bias is float32 \(3, 4, 8, 7\), expected float \(3, 4, 8, 8\)"),
    (lambda g: g.create_dataset("scores", data=np.zeros((N, H, T, T), np.int16)), "layer_2/scores is int16"),
])  # fmt: skip
def test_a_layer_unlike_its_header_is_one_error(tmp_path: Path, edit: object, said: str) -> None:
    bias = alibi(N, H, T)
    path = write_full(tmp_path / "f.h5", "alibi", bias, weights_of(bias), layer=2)
    with h5py.File(path, "a") as f:
        edit(f["layer_2"])  # type: ignore[operator]
    with pytest.raises(BiasvizError, match=said):
        open_bias_file(path)


@pytest.mark.parametrize(("value", "said"), [
    (True, None), (np.int64(0), None), ("yes", "attribute 'causal' should be true or false"),
    (np.array([1, 0]), "attribute 'causal' should be true or false"),
])  # fmt: skip
def test_a_layer_s_own_rule_is_a_flag_or_refused(tmp_path: Path, value: object, said: str | None) -> None:
    """A layer group's ``causal`` (an encoder-decoder's decoder self-attention in a file whose others see every key)
    is data from the file: a flag, or one error on opening."""
    bias = alibi(N, H, T)
    path = write_full(tmp_path / "f.h5", "alibi", bias, weights_of(bias), layer=2)
    with h5py.File(path, "a") as f:
        f.attrs["causal"] = not bool(value) if said is None else False
        f["layer_2"].attrs["causal"] = value
    if said is not None:
        with pytest.raises(BiasvizError, match=said):
            open_bias_file(path)
        return
    with open_bias_file(path) as f:
        assert f.layer_causal(2) == bool(value) and f.causal != bool(value)
