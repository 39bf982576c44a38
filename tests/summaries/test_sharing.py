"""``extract --summary`` measures whether a bias declared context-free is the same for every input, as full files do.

A model registered as ALiBi whose bias secretly adds a tiny input-dependent term is caught whichever way the
engine runs (rows formed again, or blocks streamed from the hooks in one batch or several): the file records the
largest difference and the bias is summarised per sample. Every number is checked against plain numpy on every
sample's bias of a full extract of the same windows (tests/summary_files.py), never against the summary code.
A real context-free bias records a difference of exactly 0 and its summary equals numpy's on every sample's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.run import bias_is_shared, extract
from biasviz.extraction.summary import extract_summary, summarise
from biasviz.store import open_bias_file
from biasviz.store.format import BIAS_DIFFERENCE
from tests import summary_files as ref
from tests.conftest import small_model

T, N, SECRET = 24, 5, 1e-3


class Streamed(BiasGPTAdapter):
    """Our model summarised as models whose rows cannot be formed again: blocks straight from its hook points."""

    replays = False


def _secretly_dependent(model: torch.nn.Module, from_row: int = 0) -> torch.nn.Module:
    """Every layer's ALiBi plus SECRET times the first feature of each query's input, from query ``from_row`` on:
    still declared context-free (the model's own ``rows``, used by its forward and by the summary's rows formed
    again). The first feature, not the mean: a layer norm's output has a mean of 0 to rounding."""
    for block in model.blocks:
        scheme = block.attn.pos_bias
        declared = scheme.rows

        def rows(x: torch.Tensor | None, declared=declared):  # noqa: ANN001, ANN202
            inner = declared(x)
            assert x is not None

            def block_rows(r0: int, r1: int) -> torch.Tensor:
                term = SECRET * x[:, r0:r1, 0][:, None, :, None]  # (B, 1, rows, 1): its first feature
                live = (torch.arange(r0, r1, device=x.device) >= from_row)[None, None, :, None]
                return inner(r0, r1) + term * live

            return block_rows

        object.__setattr__(scheme, "rows", rows)
    return model


def _windows(twin: bool = False) -> np.ndarray:
    ids = np.random.default_rng(3).integers(0, 97, size=(N, T))
    if twin:  # the first two samples alike: the first difference comes with the third
        ids[1] = ids[0]
    return ids


def _every_bias(adapter: BiasGPTAdapter, ids: np.ndarray, path: Path) -> list[np.ndarray]:
    """Each layer's bias of every sample (N, H, T, T) float64, NaN above the diagonal, from a full extract."""
    extract(adapter, ids, path, layers="all", device="cpu", progress=False, batch_size=2)
    with open_bias_file(path) as f:
        return [np.broadcast_to(f.read("bias", layer=layer), (N, adapter.n_heads, T, T)).astype(np.float64)
                for layer in f.layers]  # fmt: skip


def _check_against_numpy(path: Path, every: list[np.ndarray], block: int) -> None:
    """The summary's maps, profile and diagnostics are numpy's on every sample's bias."""
    with h5py.File(path) as f:
        for layer, bias in enumerate(every):
            g = f[f"layer_{layer}"]
            np.testing.assert_allclose(g["bias_mean"][()], ref.block_mean(bias.mean(0), block), rtol=1e-5,
                                       atol=1e-6, equal_nan=True)  # fmt: skip
            np.testing.assert_allclose(g["bias_std"][()], ref.block_mean(bias.std(0), block), rtol=1e-4,
                                       atol=1e-7, equal_nan=True)  # fmt: skip
            np.testing.assert_allclose(g["bias_profile"][()], ref.profile(np.nan_to_num(bias)), rtol=1e-4, atol=1e-7)
            want = ref.diagnostics(np.nan_to_num(bias))
            for name in ("context_dependence", "toeplitz_residual", "separability_residual"):
                np.testing.assert_allclose(g["diagnostics"][name], want[name], rtol=2e-3, atol=1e-7, err_msg=name)


def _largest_difference(every: list[np.ndarray]) -> float:
    """max |b_a - b_0| over layers, samples and the cells j <= i."""
    return max(float(np.nanmax(np.abs(b - b[:1]))) for b in every)


@pytest.mark.parametrize(
    ("engine", "batch", "resolution", "from_row", "twin"),
    [
        ("replay", 2, T, 0, False),  # f(d) stands for the bias until the first block differs
        ("replay", 5, 6, 13, True),  # differs from row 13 and sample 3: the first sample's rows before are fed
        # a GPU's shapes: the comparison read at the layer's end, the layer formed again from its first row
        ("replay-gpu", 2, T, 0, False),
        ("replay-gpu", 5, 6, 13, True),
        ("streamed", 5, 6, 13, False),  # one batch: blocks compared within it, the first ones summarised once
        ("streamed", 2, T, 20, True),  # several batches: the first sample's rows kept for the later ones
    ],
)
def test_a_secretly_input_dependent_bias_is_caught_by_a_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, batch: int, resolution: int, from_row: int,
    twin: bool,
) -> None:  # fmt: skip
    from biasviz.common.shapes import gpu_shapes
    from biasviz.model.modeling import Attention
    from biasviz.summaries import replay

    monkeypatch.setattr(replay, "REPLAY_BYTES", 12 * 72 * 150)  # rows formed again in blocks of a few rows
    monkeypatch.setattr(replay, "CUDA_REPLAY_BYTES", 12 * 72 * 150)
    monkeypatch.setattr(Attention, "block_elements", 12 * 5 * 150)  # the forward's row blocks: a few rows each
    cls = Streamed if engine == "streamed" else BiasGPTAdapter
    adapter = cls(_secretly_dependent(small_model("alibi"), from_row), source="test")
    assert bias_is_shared(adapter)  # what the declaration says
    ids = _windows(twin)
    every = _every_bias(adapter, ids, tmp_path / "full.h5")
    with gpu_shapes() if engine == "replay-gpu" else contextlib.nullcontext():
        extract_summary(adapter, ids, tmp_path / "s.h5", layers="all", resolution=resolution, batch_size=batch,
                        device="cpu", progress=False)  # fmt: skip
    gap = _largest_difference(every)
    assert gap > 0
    with h5py.File(tmp_path / "s.h5") as f:
        np.testing.assert_allclose(f.attrs[BIAS_DIFFERENCE], gap, rtol=1e-6)
        for layer in (0, 1):
            assert (f[f"layer_{layer}/diagnostics"]["context_dependence"] > 0).all()
    _check_against_numpy(tmp_path / "s.h5", every, -(-T // resolution))


@pytest.mark.parametrize(
    ("scheme", "engine", "batch", "resolution"),
    [("alibi", "replay", 2, T), ("alibi", "replay", 5, 6), ("fire", "replay", 2, 8), ("alibi", "streamed", 2, T),
     ("t5", "streamed", 5, 6)],
)  # fmt: skip
def test_a_context_free_summary_records_zero_and_equals_numpy_on_every_sample(
    tmp_path: Path, scheme: str, engine: str, batch: int, resolution: int
) -> None:
    adapter = (Streamed if engine == "streamed" else BiasGPTAdapter)(small_model(scheme), source="test")
    ids = _windows()
    every = _every_bias(adapter, ids, tmp_path / "full.h5")
    with h5py.File(tmp_path / "full.h5") as f:
        assert f.attrs["bias_shared"] and f.attrs[BIAS_DIFFERENCE] == 0.0  # measured by the full extract too
    extract_summary(adapter, ids, tmp_path / "s.h5", layers="all", resolution=resolution, batch_size=batch,
                    device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "s.h5") as f:
        assert f.attrs[BIAS_DIFFERENCE] == 0.0
        for layer in (0, 1):
            assert (f[f"layer_{layer}/diagnostics"]["context_dependence"] == 0).all()
            std = f[f"layer_{layer}/bias_std"][()]
            assert (std[~np.isnan(std)] == 0).all()
    _check_against_numpy(tmp_path / "s.h5", every, -(-T // resolution))


def test_a_context_dependent_summary_records_no_comparison(tmp_path: Path) -> None:
    extract_summary(BiasGPTAdapter(small_model("cable"), source="test"), _windows()[:2], tmp_path / "s.h5",
                    resolution=T, device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "s.h5") as f:
        assert BIAS_DIFFERENCE not in f.attrs


def test_processes_that_merge_their_moments_summarise_every_sample_of_a_declared_shared_bias() -> None:
    """torchrun, models streamed: a process cannot compare its samples with process 0's first, so each is summed."""
    adapter = Streamed(_secretly_dependent(small_model("alibi")), source="test")
    out = summarise(adapter, _windows(), [1], torch.device("cpu"), resolution=T, batch_size=2, progress=False,
                    merge=lambda parts, position: True)  # fmt: skip
    bias = out[1]["bias"]
    assert bias.difference is None  # nothing compared, so nothing claimed
    assert (bias.diagnostics["context_dependence"] > 0).all()


def test_a_summary_sweep_records_the_largest_difference_of_its_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second checkpoint's bias secretly depends on the input: the sweep says so, not only its first's 0."""
    import biasviz.adapters
    from biasviz.extraction.sweep import extract_sweep

    for step, seed in ((100, 0), (200, 1)):
        small_model("alibi", seed=seed).save_pretrained(tmp_path / "run" / f"checkpoint-{step}")
    load = biasviz.adapters.load_model

    def loaded(path: Path, *args: object, **kwargs: object) -> object:
        adapter = load(path, *args, **kwargs)
        if Path(path).name == "checkpoint-200":
            _secretly_dependent(adapter.model)
        return adapter

    monkeypatch.setattr(biasviz.adapters, "load_model", loaded)
    ids = _windows()[:3]
    extract_sweep(tmp_path / "run", "all", ids, tmp_path / "sweep.h5", summary=True, layers="all", resolution=T,
                  device="cpu", progress=False)  # fmt: skip
    secret = BiasGPTAdapter(_secretly_dependent(small_model("alibi", seed=1)), source="test")
    extract(secret, ids, tmp_path / "full.h5", layers="all", device="cpu", progress=False)
    with open_bias_file(tmp_path / "full.h5") as f:
        gap = max(float(np.nanmax(np.abs(b - b[:1]))) for b in (f.read("bias", layer=k) for k in f.layers))
    with h5py.File(tmp_path / "sweep.h5") as f:
        assert list(f["checkpoint"][()]) == [100, 200]
        np.testing.assert_allclose(f.attrs[BIAS_DIFFERENCE], gap, rtol=1e-6)
        cd = f["layer_0/diagnostics"]["context_dependence"]  # (checkpoint, head)
        assert (cd[0] == 0).all() and (cd[1] > 0).all()


@pytest.mark.parametrize("row0", [None, 0, 7])
def test_the_largest_difference_is_numpys_over_the_cells_a_query_sees(monkeypatch: pytest.MonkeyPatch,
                                                                      row0: int | None) -> None:  # fmt: skip
    from biasviz.summaries import sharing

    monkeypatch.setattr(sharing, "GAP_CELLS", 3 * 9)  # a few rows at a time
    rng = np.random.default_rng(0)
    heads, rows = 3, 5
    keys = 11 if row0 is None else row0 + rows
    first = rng.normal(size=(1, heads, rows, keys)).astype(np.float32)
    others = (first + rng.normal(scale=1e-3, size=(4, heads, rows, keys))).astype(np.float32)
    seen = np.ones((rows, keys), bool) if row0 is None else np.arange(keys)[None] <= row0 + np.arange(rows)[:, None]
    others[..., ~seen] = np.nan  # cells no query sees: never counted
    others[1] = first[0]  # one sample equal to the first
    agreement = sharing.Agreement(torch.device("cpu"))
    agreement.compare(torch.from_numpy(first), torch.from_numpy(others[1:2]), row0)
    assert agreement.settle() == 0.0
    agreement.compare(torch.from_numpy(first), torch.from_numpy(others), row0)
    want = np.abs(others.astype(np.float64) - first)[..., seen].max()
    assert agreement.settle() == pytest.approx(want, rel=1e-6) and want > 0
    others[2, 1, rows - 1, 0] = np.nan  # a used cell that is not a number: no difference can be claimed
    agreement.compare(torch.from_numpy(first), torch.from_numpy(others), row0)
    assert agreement.settle() == np.inf
