"""The fused path (:mod:`biasviz.summaries.fused_layer`) where samples attend different cells, file against file with
the torch path through the public call: a transformers Llama given left or right padding that differs by sample (each
sample's key validity; a padded query sees no key), and packed documents that differ by sample. Each cell's mean and
spread is over the samples that attend it, everything per sample over its own cells, and P is left out, as the torch
path takes them.

The fused path's sums come from float64 numpy (tests/summaries/fused_reference.py) in the fast tests, and from the
kernels themselves, run by Triton's interpreter on the CPU, where Triton is installed.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.summaries.test_fused_layer import _compare
from tests.summaries.test_fused_layer_traced import T, _Documents, _module_summaries, _use_reference

# (left, right) padding of each sample; "every": every sample padded, so that no sample's query 0 or 1 sees a key
PADS = {"left": ((0, 9, 4), (0, 0, 0)), "right": ((0, 0, 0), (0, 7, 13)), "every": ((2, 9, 4), (0, 0, 3))}


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=100, max_position_embeddings=T, rope_theta=500.0,
                         attn_implementation="sdpa")  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _padded_summaries(side: str, out: Path, resolution: int, monkeypatch: pytest.MonkeyPatch,
                      model: torch.nn.Module | None = None,
                      batch: int = 2) -> dict[str, tuple[dict[str, np.ndarray], dict[str, Any]]]:  # fmt: skip
    """Layer 0's datasets and attributes by the torch path and by the fused path, each sample padded as ``side``, of
    ``model`` (a Llama by default), ``batch`` samples a batch."""
    model = _llama() if model is None else model
    left, right = PADS[side]
    ids = torch.randint(1, 100, (len(left), T), generator=torch.Generator().manual_seed(3))
    valid = torch.ones(len(left), T, dtype=torch.long)
    for a, (lo, hi) in enumerate(zip(left, right, strict=True)):
        valid[a, :lo] = 0
        valid[a, T - hi :] = 0
    rows = {tuple(r.tolist()): a for a, r in enumerate(ids)}

    def forward(batch: torch.Tensor) -> Any:
        return model(batch, attention_mask=valid[[rows[tuple(r.tolist())] for r in batch]].to(batch.device))

    got = {}
    for mode in ("torch", "fused"):
        monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            biasviz.extract(model, ids.numpy(), out / f"{mode}.h5", summary=True, progress=False, batch_size=batch,
                            forward=forward, resolution=resolution, device="cpu")  # fmt: skip
        with h5py.File(out / f"{mode}.h5") as f:
            got[mode] = ({name: f["layer_0"][name][()] for name in f["layer_0"]}, dict(f["layer_0"].attrs))
    return got


def _same_file(got: dict[str, tuple[dict[str, np.ndarray], dict[str, Any]]]) -> None:
    fused, torch_path = got["fused"], got["torch"]
    assert (torch_path[1]["statistics"], fused[1]["statistics"]) == ("torch", "fused")
    assert fused[1].get("note") == torch_path[1].get("note") and "samples masked differently" in fused[1]["note"]
    assert "positional_mean" not in fused[0] and "attending_samples" in fused[0]
    _compare(fused[0], torch_path[0])


@pytest.mark.parametrize(("side", "resolution"), [("left", 8), ("right", 4), ("left", 1), ("every", 8)])
def test_padding_that_differs_by_sample_fused_writes_what_the_torch_path_writes(
    side: str, resolution: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    _use_reference(monkeypatch)
    _same_file(_padded_summaries(side, tmp_path, resolution, monkeypatch))


def _bloom() -> torch.nn.Module:
    """transformers' BLOOM (1 layer, 4 heads, random weights): its ALiBi positions start after each sample's own
    padding, so its bias of the key differs by sample as well as its cells."""
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    return BloomForCausalLM(BloomConfig(vocab_size=100, hidden_size=32, n_layer=1, n_head=4)).eval()


@pytest.mark.parametrize(("side", "resolution", "batch"), [("left", 8, 2), ("left", 1, 3), ("every", 8, 1)])
def test_bloom_s_bias_beside_padding_fused_writes_what_the_torch_path_writes(
    side: str, resolution: int, batch: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Each sample's own row of keys, m·(j - its padding), in the kernels' scores; the bias's own maps, profile and
    SEs over each sample's own cells, formed again in torch (one sample a batch: the first's row banked, then the
    others')."""
    _use_reference(monkeypatch)
    got = _padded_summaries(side, tmp_path, resolution, monkeypatch, model=_bloom(), batch=batch)
    _same_file(got)
    assert "bias_mean" in got["fused"][0] and float(np.nanmax(got["fused"][0]["bias_std"])) > 0  # it differs


def test_documents_of_each_sample_s_own_fused_write_what_the_torch_path_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """Each cell's mean over the samples that attend it, each sample's tenths and counts over its own documents."""
    _use_reference(monkeypatch)
    torch.manual_seed(3)
    ids = np.random.default_rng(3).integers(1, 50, size=(3, T))
    ids[1, 9] = ids[2, 20] = 0  # documents of their own
    _same_file(_module_summaries(_Documents(same=False), ids, tmp_path, 8, monkeypatch))


@pytest.mark.parametrize(("side", "model"), [("left", "llama"), ("every", "llama"), ("left", "bloom")])
def test_padding_through_the_kernels_writes_what_the_torch_path_writes(
    side: str, model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """The same, the sums from the kernels themselves (Triton's interpreter on the CPU)."""
    pytest.importorskip("triton")
    from biasviz.summaries import kernels

    if not kernels.interpreted() and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
    _same_file(_padded_summaries(side, tmp_path, 8, monkeypatch, model=_bloom() if model == "bloom" else None))
