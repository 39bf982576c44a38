"""Every standard error a summary stores is shaped like its mean's row with the stat axis dropped (the sample axis
of a per-sample row, the sink share's: its SE is of the mean over samples) (docs/position-measures.md): read from
written files of a biased model (replayed), a rotary one and a streamed GPT-2, and from the table of datasets where
it lists both."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.store.datasets import ROWS
from tests.conftest import small_model

T, N = 16, 4


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=T)).eval()


@pytest.mark.parametrize("model", ["alibi", "rope", "gpt2"])
def test_each_se_is_shaped_like_its_mean(tmp_path: Path, model: str) -> None:
    source = _gpt2() if model == "gpt2" else small_model(model)
    ids = np.random.default_rng(0).integers(1, 64, size=(N, T))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(source, ids, out, summary=True, progress=False, resolution=4, layers=-1)
    with h5py.File(out) as f:
        group = f[next(k for k in f if k.startswith("layer_"))]
        errors = [name for name in group if name.endswith("_se")]
        assert {"weights_mean_se", "positional_mean_se", "positional_profile_se", "band_mass_se"} <= set(errors)
        for name in errors:  # by the dimension labels the file gives each axis
            mean, se = group[name.removesuffix("_se")], group[name]
            labels = [d.label for d in mean.dims]
            assert [d.label for d in se.dims] == [x for x in labels if x not in ("stat", "sample")], name
            kept = [size for size, label in zip(mean.shape, labels, strict=True) if label not in ("stat", "sample")]
            assert list(se.shape) == kept, (name, se.shape, mean.shape)
            row = ROWS.get(name.removesuffix("_se"))  # and by the table, where it lists the mean
            assert row is None or labels == list(row.dims), name


def test_the_table_gives_each_se_the_dims_of_its_mean_less_the_stat_axis() -> None:
    for name, row in ROWS.items():
        base = ROWS.get(name.removesuffix("_se")) if name.endswith("_se") else None
        if base is not None:
            assert row.dims == tuple(d for d in base.dims if d not in ("stat", "sample")), name
