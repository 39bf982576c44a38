"""``compression=`` (``extract --compression``): every choice stores the values a gzip file holds, read back by
h5py itself, and those values are the attention weights computed here from the module's own parameters."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import biasviz
from biasviz.common.errors import BiasvizError

HEADS, D, T, SAMPLES = 2, 4, 32, 3


class TwoHeads(torch.nn.Module):
    """One causal SDPA call over two heads: nothing but q, k and v from an embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, HEADS * D)
        self.q = torch.nn.Linear(HEADS * D, HEADS * D)
        self.k = torch.nn.Linear(HEADS * D, HEADS * D)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], HEADS, D).transpose(1, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        q, k = self.heads(self.q(x)), self.heads(self.k(x))
        return F.scaled_dot_product_attention(q, k, self.heads(x), is_causal=True)


def _reference(model: TwoHeads, ids: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(D)) over the keys up to each query, in float64 NumPy: (samples, heads, T, T)."""
    with torch.no_grad():
        x = model.emb(torch.from_numpy(ids)).double()
        q = model.heads(x @ model.q.weight.double().T + model.q.bias.double()).numpy()
        k = model.heads(x @ model.k.weight.double().T + model.k.bias.double()).numpy()
    s = q @ k.swapaxes(-1, -2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


CHOICES = {None: ("gzip", 1, True), "gzip": ("gzip", 1, True), "gzip:0": ("gzip", 0, True),
           "gzip:9": ("gzip", 9, True), "lzf": ("lzf", None, True), "none": (None, None, False)}  # fmt: skip


def test_every_compression_stores_the_same_weights(tmp_path: Path) -> None:
    model = TwoHeads()
    ids = np.random.default_rng(1).integers(0, 50, (SAMPLES, T))
    want = _reference(model, ids)
    stored = {}
    for choice, (name, level, shuffle) in CHOICES.items():
        out = tmp_path / f"{choice}.h5"
        biasviz.extract(model, ids, out, layers="all", device="cpu", progress=False, compression=choice,
                        batch_size=2)  # fmt: skip
        with h5py.File(out, "r") as f:
            ds = f["layer_0/weights"]
            assert (ds.compression, ds.compression_opts, bool(ds.shuffle)) == (name, level, shuffle), choice
            stored[choice] = ds[()]
        np.testing.assert_allclose(stored[choice], want, rtol=1e-5, atol=1e-6, err_msg=str(choice))
    for choice, values in stored.items():
        np.testing.assert_array_equal(values, stored["gzip"], err_msg=str(choice))
    sizes = {c: (tmp_path / f"{c}.h5").stat().st_size for c in ("gzip:9", "none")}
    assert sizes["none"] > sizes["gzip:9"]  # no filter at all: the largest


@pytest.mark.parametrize("bad", ["gzip:12", "zstd", "gzip:", "lzf:1", ""])
def test_a_bad_compression_is_refused_before_anything_runs(tmp_path: Path, bad: str) -> None:
    calls = []
    model = TwoHeads()
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(BiasvizError, match=r"^--compression .*: not gzip, gzip:N \(N a level 0-9\), lzf or"):
        biasviz.extract(model, np.zeros((1, T), dtype=np.int64), tmp_path / "x.h5", device="cpu", compression=bad)
    assert not calls and not list(tmp_path.iterdir())
