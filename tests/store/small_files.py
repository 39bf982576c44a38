"""Small format-1 files for the tests of tests/store, written with :class:`~biasviz.store.BiasFileWriter`: the
attributes every file carries, and a file of random matrices."""

from __future__ import annotations

import json

import numpy as np
import torch

from biasviz.store import BiasFileWriter

H, T = 3, 6


def _attrs(**extra: object) -> dict[str, object]:
    base = {
        "scheme": "alibi", "context_dependent": False, "source_model": "/models/m", "model_sha256": "ab" * 32,
        "architecture": "biasviz-gpt2", "n_layers": 2, "device": "cpu", "seed": 7, "text_source": "stdlib:/x",
        "biasviz_version": "0.1.0", "torch_version": str(torch.__version__), "bias_convention": "relative",
        "config_json": json.dumps({"n_head": H, "scheme": "alibi"}),
    }  # fmt: skip
    return {**base, **extra}


def _write(path, n=2, layers=(1,), has_bias=True, dtype="float32", bias_batch=None, **kw):  # noqa: ANN001, ANN202
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(n, T))
    weights = {layer: rng.random((n, H, T, T)).astype(np.float32) for layer in layers}
    bias = {layer: rng.normal(size=(bias_batch or n, H, T, T)).astype(np.float32) for layer in layers}
    writer = BiasFileWriter(path, attrs=_attrs(), n_samples=n, n_heads=H, seq_len=T, layers=layers,
                            has_bias=has_bias, dtype=dtype, **kw)  # fmt: skip
    with writer as w:
        w.write_batch(ids, weights, bias if has_bias else None)
    return ids, weights, bias
