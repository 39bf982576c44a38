"""The summary engine linear in samples: rows formed again over all samples, a bank spilled to disk, blocks of rows.

Each summary is compared with a full extract of the same windows (every sample's every cell, read with
h5py) reduced by numpy: per-cell mean and standard deviation over samples, then block means.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz.summaries.bank as bank_module
import biasviz.summaries.replay as replay_module
from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.run import extract
from biasviz.extraction.summary import extract_summary
from biasviz.summaries.bank import SampleBank
from tests.conftest import small_model
from tests.extraction.test_summary import _block_means

T = 48


def _windows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 97, size=(n, T))


def _numpy_summary(full: h5py.File, layer: int, kind: str, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-cell mean and std over samples of a full file's (N or 1, H, T, T), causal cells only; block means."""
    x = full[f"layer_{layer}/{kind}"][()].astype(np.float64)
    x = np.broadcast_to(x, (full.attrs["samples"], *x.shape[1:])).copy()
    x[..., ~np.tril(np.ones((T, T), bool))] = np.nan
    return _block_means(x.mean(0), block), _block_means(x.std(0), block)


CASES = [("alibi", 7, 1), ("cable", 7, 2), ("fox", 16, 1), ("fire", T, 3), ("nope", 12, 5)]


@pytest.mark.parametrize(("scheme", "resolution", "batch"), CASES)
def test_rows_formed_again_from_a_spilled_bank_equal_the_full_extract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, resolution: int, batch: int
) -> None:  # fmt: skip
    """Nothing kept in memory (every array in a temporary file), blocks of a few rows, each finished a row at a
    time: the same numbers."""
    monkeypatch.setattr(bank_module, "BANK_BYTES", 0)
    monkeypatch.setattr(replay_module, "REPLAY_BYTES", 12 * 72 * 200)  # ~200 cells a block: many blocks
    monkeypatch.setattr(replay_module, "CHUNK_CELLS", 1)  # one row per step
    ids = _windows(5, seed=2)
    adapter = BiasGPTAdapter(small_model(scheme), source="test")
    extract(adapter, ids, tmp_path / "full.h5", layers="all", device="cpu")
    extract_summary(adapter, ids, tmp_path / "sum.h5", layers="all", resolution=resolution, batch_size=batch,
                    device="cpu", progress=False)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.h5", "sum.h5"]  # the bank's files left no trace
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        b = summ.attrs["block"]
        for layer in (0, 1):
            kinds = ["weights"] + (["bias"] if "bias" in full[f"layer_{layer}"] else [])
            for kind in kinds:
                mean, std = _numpy_summary(full, layer, kind, b)
                s = summ[f"layer_{layer}"]
                np.testing.assert_allclose(s[f"{kind}_mean"][()], mean, rtol=1e-5, atol=1e-6, equal_nan=True)
                np.testing.assert_allclose(s[f"{kind}_std"][()], std, rtol=1e-4, atol=1e-6, equal_nan=True)


def test_a_spilled_bank_gives_every_dataset_a_bank_in_memory_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Section 12 and 14 included: P's jackknife reads only the keys it has not summed yet from the bank's file, and
    each sample's key blocks come out as from memory, however the blocks of rows fall."""
    ids = _windows(5, seed=3)
    adapter = BiasGPTAdapter(small_model("alibi"), source="test")
    extract_summary(adapter, ids, tmp_path / "memory.h5", layers=-1, resolution=12, device="cpu", progress=False)
    monkeypatch.setattr(bank_module, "BANK_BYTES", 0)
    monkeypatch.setattr(replay_module, "REPLAY_BYTES", 12 * 72 * 150)
    extract_summary(adapter, ids, tmp_path / "spilled.h5", layers=-1, resolution=12, device="cpu", progress=False)
    with h5py.File(tmp_path / "memory.h5") as one, h5py.File(tmp_path / "spilled.h5") as other:
        names = sorted(one["layer_1"])
        assert "positional_mean_se" in names and "weights_entropy_se" in names
        for name in names:
            a, b = one[f"layer_1/{name}"][()], other[f"layer_1/{name}"][()]
            for field in a.dtype.names or [None]:  # records (the sink keys) field by field
                np.testing.assert_allclose(b if field is None else b[field], a if field is None else a[field],
                                           rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=name)  # fmt: skip


def test_the_bank_forward_ends_at_the_last_layers_k() -> None:
    """What fills the bank needs q, k and x of the captured layers: the last one's attention output (its c_proj),
    everything after it, and the logits never run; an earlier captured layer's attention does (the next needs it)."""
    model = small_model("alibi")
    adapter = BiasGPTAdapter(model, source="test")
    ran: list[str] = []
    hooks = [model.blocks[0].attn.c_proj.register_forward_hook(lambda *a: ran.append("c_proj 0")),
             model.blocks[1].attn.hook_k.register_forward_hook(lambda *a: ran.append("k 1")),
             model.blocks[1].attn.c_proj.register_forward_hook(lambda *a: ran.append("c_proj 1"))]  # fmt: skip
    bank = SampleBank(2, device=torch.device("cpu"))
    try:
        with adapter.keep([0, 1], bank):
            adapter.forward(torch.as_tensor(_windows(2)))
    finally:
        for h in hooks:
            h.remove()
    assert ran == ["c_proj 0", "k 1"]
    assert {name for _, name in bank.names()} == {"q", "k", "x"}
    assert bank.get(1, "k", 1, 0, T).shape == (T, model.config.n_embd)


def test_replayed_blocks_hold_at_least_sixteen_rows_within_the_cap() -> None:
    """A block's scores read every key of its prefix: blocks of a few rows at long lengths are bound by memory. The
    default budget gives every block at least MIN_REPLAY_ROWS rows (the last one apart), within REPLAY_CAP bytes."""
    cpu = torch.device("cpu")
    per_cell = 12 * replay_module.CELL_BYTES
    for seq_len in (4096, 32768):
        blocks = list(replay_module.row_blocks(seq_len, 12, cpu, False))
        assert blocks[0][0] == 0 and blocks[-1][1] == seq_len
        assert all(b[1] == a[0] for b, a in zip(blocks, blocks[1:], strict=False))
        assert all(r1 - r0 >= replay_module.MIN_REPLAY_ROWS for r0, r1 in blocks[:-1])
        assert all((r1 - r0) * r1 * per_cell <= replay_module.REPLAY_CAP for r0, r1 in blocks)
    capped = list(replay_module.row_blocks(65536, 12, cpu, False))  # 16 rows would pass the cap: fewer rows
    assert all((r1 - r0) * r1 * per_cell <= replay_module.REPLAY_CAP for r0, r1 in capped)
    assert capped[-2][1] - capped[-2][0] < replay_module.MIN_REPLAY_ROWS
