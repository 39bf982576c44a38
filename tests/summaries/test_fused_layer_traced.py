"""The fused path (:mod:`biasviz.summaries.fused_layer`) for a model biasviz has no adapter for: a transformers Llama
with grouped keys, its SDPA calls traced (:class:`~biasviz.adapters.traced.TracedAdapter`), summarised file against
file with the torch path (rows formed again block by block) through the public call.

The kernels read each key head once (the bank holds k repeated per group of query heads). Their accumulators come from
float64 numpy (tests/summaries/fused_reference.py) in the fast tests, and from the kernels themselves, run by Triton's
interpreter on the CPU, where Triton is installed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.adapters.transformers_traced import load_transformers_sdpa
from biasviz.extraction.summary import extract_summary
from tests.summaries.test_fused_layer import _compare, _reference_accumulators
from tests.summaries.tiny_llama import save_tiny_llama

T, HEADS, KV_HEADS = 32, 4, 2


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("llama"), T, heads=HEADS, kv_heads=KV_HEADS)


def summaries(path: Path, ids: np.ndarray, out: Path, resolution: int, monkeypatch: pytest.MonkeyPatch,
              **options: object) -> dict[str, tuple[dict[str, np.ndarray], dict[str, object]]]:  # fmt: skip
    """Layer 1's datasets and attributes, by the torch path and by the fused path."""
    got = {}
    for mode in ("torch", "fused"):
        monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extract_summary(load_transformers_sdpa(path), ids, out / f"{mode}.h5", layers=[1], resolution=resolution,
                            batch_size=2, device="cpu", progress=False, **options)  # fmt: skip
        with h5py.File(out / f"{mode}.h5") as f:
            g = f["layer_1"]
            got[mode] = ({name: g[name][()] for name in g}, dict(g.attrs))
    return got


@pytest.mark.parametrize(("samples", "resolution"), [(3, 8), (4, T), (2, 4)])
def test_a_traced_llama_with_grouped_keys_fused_writes_what_the_torch_path_writes(
    llama_dir: Path, samples: int, resolution: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    from biasviz.summaries import kernels

    seen = []

    def reference(q: torch.Tensor, k: torch.Tensor, *args: object, **kwargs: object) -> dict[str, torch.Tensor]:
        seen.append(k.shape[1])
        return _reference_accumulators(q, k, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", reference, raising=False)
    ids = np.random.default_rng(samples).integers(0, 100, size=(samples, T))
    got = summaries(llama_dir, ids, tmp_path, resolution, monkeypatch)
    assert (got["torch"][1]["statistics"], got["fused"][1]["statistics"]) == ("torch", "fused")
    assert seen == [KV_HEADS]  # each key head once, not repeated per query head
    assert "positional_frequency" in got["fused"][0] or samples < 2  # the rotary measures beside
    _compare(got["fused"][0], got["torch"][0])


@pytest.mark.parametrize(("model", "seed"), [("llama_dir", 5), ("mistral_dir", 6)])
def test_the_kernels_themselves_write_what_the_torch_path_writes(
    model: str, seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:  # fmt: skip
    """A traced Llama (grouped keys) and a sliding window, the sums from the kernels themselves (Triton's interpreter
    on the CPU), file against file."""
    pytest.importorskip("triton")
    from biasviz.summaries import kernels

    if not kernels.interpreted() and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
    ids = np.random.default_rng(seed).integers(0, 100, size=(3, T))
    got = summaries(request.getfixturevalue(model), ids, tmp_path, 8, monkeypatch)
    assert got["fused"][1]["statistics"] == "fused"
    _compare(got["fused"][0], got["torch"][0])


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Mistral with grouped keys and a sliding window of 12 keys: its SDPA calls get the window as their mask."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=T,
                           sliding_window=12, rope_theta=500.0)  # fmt: skip
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("mistral") / "mistral"
    MistralForCausalLM(config).save_pretrained(path)
    return path


class _Documents(torch.nn.Module):
    """One SDPA call over packed documents: the documents start where a token is 0 (``same``: at 0, 11 and 23 in
    every sample instead), each query attending the keys of its own document up to itself."""

    def __init__(self, same: bool) -> None:
        super().__init__()
        self.same = same
        self.embed = torch.nn.Embedding(50, 16)
        self.qk = torch.nn.Linear(16, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(self.embed(ids)).view(*ids.shape, 2, 4, 8).unbind(2)  # (B, T, 4 heads, 8) each
        t = ids.shape[-1]
        starts = torch.zeros_like(ids, dtype=torch.bool)
        starts[:, [0, 11, 23] if self.same else 0] = True
        if not self.same:
            starts |= ids == 0
        doc = starts.long().cumsum(-1)  # (B, T)
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        mask = (j <= i) & (doc[:, :, None] == doc[:, None, :])  # (B, T, T)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask[:, None])


def _use_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from biasviz.summaries import kernels

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)


def _module_summaries(model: torch.nn.Module, ids: np.ndarray, out: Path, resolution: int,
                      monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[dict[str, np.ndarray], dict[str, object]]]:
    from biasviz.adapters.traced import TracedAdapter

    got = {}
    for mode in ("torch", "fused"):
        monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extract_summary(TracedAdapter(model.eval()), ids, out / f"{mode}.h5", layers=[0], resolution=resolution,
                            batch_size=2, device="cpu", progress=False)  # fmt: skip
        with h5py.File(out / f"{mode}.h5") as f:
            got[mode] = ({name: f["layer_0"][name][()] for name in f["layer_0"]}, dict(f["layer_0"].attrs))
    return got


@pytest.mark.parametrize(("samples", "resolution"), [(3, 8), (4, T), (2, 4)])
def test_a_sliding_window_fused_writes_what_the_torch_path_writes(
    mistral_dir: Path, samples: int, resolution: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    _use_reference(monkeypatch)
    ids = np.random.default_rng(samples + 10).integers(0, 100, size=(samples, T))
    got = summaries(mistral_dir, ids, tmp_path, resolution, monkeypatch)
    assert (got["torch"][1]["statistics"], got["fused"][1]["statistics"]) == ("torch", "fused")
    i, j = np.indices((T, T))
    assert np.array_equal(got["fused"][0]["attended"][0] > 0, (j <= i) & (j > i - 12)) or resolution != T
    _compare(got["fused"][0], got["torch"][0])


def test_packed_documents_the_same_in_every_sample_fused_write_what_the_torch_path_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    _use_reference(monkeypatch)
    torch.manual_seed(3)
    ids = np.random.default_rng(3).integers(1, 50, size=(3, T))
    got = _module_summaries(_Documents(same=True), ids, tmp_path, 8, monkeypatch)
    assert got["fused"][1]["statistics"] == "fused"
    _compare(got["fused"][0], got["torch"][0])


def test_masks_the_kernels_cannot_take_say_why() -> None:
    from biasviz.summaries.fused_layer import _mask_fits

    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    window = causal & ~torch.ones(8, 8, dtype=torch.bool).tril(-3)
    assert _mask_fits(causal[None]) is None and _mask_fits(torch.stack([window, window])) is None
    assert _mask_fits(torch.stack([window, causal])) == "its heads attend different cells"
    assert _mask_fits(torch.ones(1, 8, 8, dtype=torch.bool)) == "its mask attends keys after the query"
    empty = causal.clone()
    empty[3] = False
    assert _mask_fits(empty[None]) == "a query of its mask attends no key"


def test_heads_masked_differently_in_each_sample_are_left_to_the_torch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """The kernels take one set of cells a sample: where the heads of a sample attend cells of their own, the layer is
    summarised by the torch path (it says so: ``statistics``), the same file as when the torch path is asked for."""
    from tests.extraction.test_summary_masked_heads import HeadWindows, _ids

    _use_reference(monkeypatch)
    torch.manual_seed(0)
    got = _module_summaries(HeadWindows(marked=True), _ids(True).numpy(), tmp_path, 8, monkeypatch)
    assert got["fused"][1]["statistics"] == got["torch"][1]["statistics"] == "torch"
    assert got["fused"][0].keys() == got["torch"][0].keys()
    for name, values in got["torch"][0].items():
        assert _same(got["fused"][0][name], values), name


def test_a_call_that_sees_keys_after_its_query_is_left_to_the_torch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """The kernels form causal rows: an encoder's layer is formed again by torch (it says so), as when asked for."""
    from tests.extraction.test_summary_bidirectional import Encoder

    _use_reference(monkeypatch)
    torch.manual_seed(0)
    ids = np.random.default_rng(4).integers(1, 50, size=(3, 16))
    got = _module_summaries(Encoder("window"), ids, tmp_path, 8, monkeypatch)
    assert got["fused"][1]["statistics"] == got["torch"][1]["statistics"] == "torch"
    for name, values in got["torch"][0].items():
        assert _same(got["fused"][0][name], values), name


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal to the bit, NaN where NaN, a table's fields one by one."""
    if want.dtype.names:
        return all(_same(got[field], want[field]) for field in want.dtype.names)
    return bool(np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"))
