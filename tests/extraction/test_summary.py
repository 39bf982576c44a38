"""``extract --summary`` against a full extract of the same windows, read back with plain h5py and numpy."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.errors import BiasvizError
from biasviz.diagnostics.measures import diagnose_array
from biasviz.extraction.run import extract
from biasviz.extraction.summary import extract_summary
from tests.conftest import small_model

T = 48


def _windows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 97, size=(n, T))


def _block_means(cells: np.ndarray, b: int) -> np.ndarray:
    """(..., T, T) with NaN on unused cells -> (..., nb, nb) means over each block's used cells."""
    nb = -(-T // b)
    padded = np.full((*cells.shape[:-2], nb * b, nb * b), np.nan)
    padded[..., :T, :T] = cells
    blocks = padded.reshape(*cells.shape[:-2], nb, b, nb, b)
    with warnings.catch_warnings():  # blocks wholly above the diagonal: the mean of nothing is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(blocks, axis=(-3, -1))


@pytest.mark.parametrize("scheme", ["alibi", "cable", "t5", "nope"])
@pytest.mark.parametrize("batch", [2, 5])
def test_summary_at_full_resolution_equals_the_full_extract(tmp_path: Path, scheme: str, batch: int) -> None:
    ids = _windows(5)
    adapter = BiasGPTAdapter(small_model(scheme), source="test")
    extract(adapter, ids, tmp_path / "full.h5", layers="all", device="cpu")
    extract_summary(adapter, ids, tmp_path / "sum.h5", layers="all", resolution=T, batch_size=batch, device="cpu")
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        assert summ.attrs["summary"] and summ.attrs["block"] == 1 and summ.attrs["resolution"] == T
        assert summ.attrs["samples"] == 5
        np.testing.assert_array_equal(summ["input_ids"][()], full["input_ids"][()])
        for layer in (0, 1):
            g, s = full[f"layer_{layer}"], summ[f"layer_{layer}"]
            kinds = ["weights"] + (["bias"] if "bias" in g else [])
            assert ("bias_mean" in s) == ("bias" in g)
            assert bool(full.attrs.get("bias_shared", False)) == (scheme in ("alibi", "t5"))  # stored once
            for kind in kinds:
                x = g[kind][()].astype(np.float64)  # (N or 1, H, T, T), NaN / 0 above the diagonal
                x = np.broadcast_to(x, (5, *x.shape[1:])).copy()
                if kind == "weights":
                    x[..., ~np.tril(np.ones((T, T), bool))] = np.nan
                np.testing.assert_allclose(s[f"{kind}_mean"][()], x.mean(0), rtol=1e-5, atol=1e-6, equal_nan=True)
                np.testing.assert_allclose(s[f"{kind}_std"][()], x.std(0), rtol=1e-4, atol=1e-6, equal_nan=True)
            if "bias" in g:
                ref = diagnose_array(np.broadcast_to(g["bias"][()], (5, *g["bias"].shape[1:])))
                diag = s["diagnostics"][()]
                for h, d in enumerate(ref):
                    assert diag["toeplitz_residual"][h] == pytest.approx(d.toeplitz_residual, rel=1e-5, abs=1e-6)
                    assert diag["separability_residual"][h] == pytest.approx(d.separability_residual, rel=1e-5,
                                                                             abs=1e-6)  # fmt: skip
                    assert diag["context_dependence"][h] == pytest.approx(d.context_dependence, rel=1e-5, abs=1e-7)
                    np.testing.assert_allclose(s["bias_profile"][0, h], d.profile_mean, rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(s["bias_profile"][1, h], d.profile_std, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("resolution", [7, 16, 24])
def test_pooled_maps_are_block_means_of_the_full_maps(tmp_path: Path, resolution: int) -> None:
    ids = _windows(3, seed=1)
    adapter = BiasGPTAdapter(small_model("cable"), source="test")
    extract(adapter, ids, tmp_path / "full.h5", device="cpu")
    extract_summary(adapter, ids, tmp_path / "sum.h5", resolution=resolution, device="cpu")
    b = -(-T // resolution)
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        assert summ.attrs["block"] == b
        np.testing.assert_array_equal(summ["query_block"][()], np.arange(0, T, b))
        for kind in ("bias", "weights"):
            x = full[f"layer_1/{kind}"][()].astype(np.float64)
            x[..., ~np.tril(np.ones((T, T), bool))] = np.nan
            for stat, cells in (("mean", x.mean(0)), ("std", x.std(0))):
                got = summ[f"layer_1/{kind}_{stat}"][()]
                assert got.shape == (12, -(-T // b), -(-T // b))
                np.testing.assert_allclose(got, _block_means(cells, b), rtol=1e-4, atol=1e-6, equal_nan=True)


def test_file_size_does_not_grow_with_samples(tmp_path: Path) -> None:
    adapter = BiasGPTAdapter(small_model("alibi"), source="test")
    sizes = []
    for n in (3, 16):
        out = tmp_path / f"{n}.h5"
        extract_summary(adapter, _windows(n), out, resolution=12, device="cpu")
        sizes.append(out.stat().st_size)
    # only what is per sample grows: /input_ids (and its sample scale), 13 more windows of 48 int32 ids, 8 bytes a
    # position at most, and per layer the sink shares (head) and the top 8 sink keys (head, 8 records of 8 bytes)
    per_sample = T * 8 + adapter.n_layers * adapter.n_heads * (4 + 8 * 8)
    assert 0 <= sizes[1] - sizes[0] <= 13 * per_sample, sizes


@pytest.mark.parametrize("bad", [0, -3])  # R > T is the exact per-cell map, as R = T (docs/hdf5.md, 'Summary files')
def test_a_resolution_below_1_is_refused_before_any_work(tmp_path: Path, bad: int) -> None:
    adapter = BiasGPTAdapter(small_model("alibi"), source="test")
    with pytest.raises(BiasvizError, match="--resolution"):
        extract_summary(adapter, _windows(2), tmp_path / "x.h5", resolution=bad, device="cpu")
    assert not list(tmp_path.iterdir())


def test_a_traced_module_summarised_through_the_python_api(tmp_path: Path) -> None:
    """biasviz.extract(module, ids, out, summary=True): the traced calls' weights, reduced like a full extract."""
    import torch

    import biasviz
    from tests import nano_gpt

    fused, _ = nano_gpt.pair()
    idx = torch.randint(0, 101, (3, 40), generator=torch.Generator().manual_seed(3))
    biasviz.extract(fused, idx, tmp_path / "full.h5", layers=[1], device="cpu", progress=False)
    biasviz.extract(fused, idx, tmp_path / "sum.h5", layers=[1], device="cpu", progress=False, summary=True,
                    resolution=10)  # fmt: skip
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        assert summ.attrs["scheme"] == "captured" and summ.attrs["block"] == 4
        w = full["layer_1/weights"][()].astype(np.float64)  # (3, H, 40, 40)
        w[..., ~np.tril(np.ones((40, 40), bool))] = np.nan
        nb = 10
        blocks = w.mean(0).reshape(w.shape[1], nb, 4, nb, 4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmean(blocks, axis=(2, 4))
        np.testing.assert_allclose(summ["layer_1/weights_mean"][()], want, rtol=1e-5, atol=1e-7, equal_nan=True)


def test_our_model_given_in_python_is_extracted_through_its_hook_points(tmp_path: Path) -> None:
    import biasviz

    model = small_model("alibi")
    biasviz.extract(model, _windows(2), tmp_path / "x.h5", device="cpu", progress=False, summary=True)
    with h5py.File(tmp_path / "x.h5") as f:
        assert f.attrs["scheme"] == "alibi" and f.attrs["resolution"] == T  # R = min(1024, T)
    with pytest.raises(BiasvizError, match="--resolution applies with --summary"):
        biasviz.extract(model, _windows(2), tmp_path / "y.h5", device="cpu", resolution=8)


@pytest.mark.cuda
@pytest.mark.parametrize("resolution", [16, T])  # blocks (every sample in one batch) and cells (batch by batch)
@pytest.mark.parametrize("scheme", ["alibi", "cable", "fire"])
def test_a_summary_on_the_gpu_equals_the_one_on_the_cpu(tmp_path: Path, scheme: str, resolution: int) -> None:
    """Reduced where the model runs: on CUDA the running sums live on the GPU; the file is the CPU's to rounding."""
    ids = _windows(3, seed=4)
    adapter = BiasGPTAdapter(small_model(scheme), source="test")
    for dev, batch in (("cpu", 1), ("cuda", 1), ("cuda", 3)):
        extract_summary(adapter, ids, tmp_path / f"{dev}{batch}.h5", resolution=resolution, batch_size=batch,
                        device=dev)  # fmt: skip
    with h5py.File(tmp_path / "cpu1.h5") as cpu:
        for name in ("cuda1.h5", "cuda3.h5"):
            with h5py.File(tmp_path / name) as gpu:
                for ds in ("layer_1/weights_mean", "layer_1/weights_std", "layer_1/bias_mean", "layer_1/bias_profile"):
                    np.testing.assert_allclose(gpu[ds][()], cpu[ds][()], rtol=1e-4, atol=1e-6, equal_nan=True)


@pytest.mark.cuda
def test_a_traced_rotary_summary_on_the_gpu_equals_the_one_on_the_cpu(tmp_path: Path) -> None:
    """Every docs/position-measures.md measure of a rotary transformers model (frequency use, P split by pair, their
    SEs) is formed where the bank is: on CUDA the same numbers as on the CPU, nothing left on another device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import biasviz

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    path = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 attn_implementation="sdpa")).save_pretrained(path)  # fmt: skip
    ids = np.random.default_rng(2).integers(0, 100, size=(4, 64))
    for dev in ("cpu", "cuda"):
        biasviz.extract(str(path), ids, tmp_path / f"{dev}.h5", layers=-1, device=dev, progress=False, summary=True,
                        resolution=16)  # fmt: skip
    with h5py.File(tmp_path / "cpu.h5") as cpu, h5py.File(tmp_path / "cuda.h5") as gpu:
        names = sorted(n for n in cpu["layer_1"] if isinstance(cpu["layer_1"][n], h5py.Dataset))
        assert {"frequency_use", "positional_frequency", "positional_frequency_se"} <= set(names)
        assert names == sorted(n for n in gpu["layer_1"] if isinstance(gpu["layer_1"][n], h5py.Dataset))
        for name in names:
            want, got = cpu["layer_1"][name][()], gpu["layer_1"][name][()]
            if name == "sink_keys":  # (index, share) by rank
                _same_ranking(got, want)
                continue
            if want.dtype.names:  # diagnostics, positional_diagnostics: a compound of measures per head
                assert got.dtype.names == want.dtype.names, name
                for field in want.dtype.names:
                    np.testing.assert_allclose(got[field], want[field], rtol=1e-3, atol=1e-5, equal_nan=True,
                                               err_msg=f"{name}.{field}")  # fmt: skip
                continue
            scale = float(np.nanmax(np.abs(want))) if np.isfinite(want).any() else 0.0
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * max(scale, 1.0), equal_nan=True,
                                       err_msg=name)  # fmt: skip


def _same_ranking(got: np.ndarray, want: np.ndarray) -> None:
    """Sink keys by rank: the same shares, and the same keys wherever a share stands clear of its neighbours (two
    keys whose shares differ by rounding may trade places between two devices)."""
    np.testing.assert_allclose(got["share"], want["share"], rtol=1e-3, atol=1e-6)
    share = want["share"]
    gap = np.abs(np.diff(share, axis=-1)) > 1e-4
    clear = np.ones(share.shape, bool)
    clear[..., 1:] &= gap
    clear[..., :-1] &= gap
    np.testing.assert_array_equal(got["index"][clear], want["index"][clear])



def test_a_streamed_summary_too_large_to_keep_is_refused_before_any_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows streamed as the model forms them (as a summary whose rows cannot be formed again runs): over batches of one
    sample, each layer keeps float64 moments of the weights and the scores and the first sample's rows of the declared
    bias, and P's float32 sums of the scores and the bias, of every cell: (16 + 16 + 2 + 4 + 4) x 4 x 256 x 256 bytes
    = 10.5 MiB a layer, beside the forward's own 1 MiB of weights. A machine said to have 20 MiB refuses two layers,
    naming the size, before the model runs; one layer runs."""
    import torch

    import biasviz.common.memory as memory
    from biasviz.extraction.summary import summarise

    t = 256
    adapter = BiasGPTAdapter(small_model("alibi", n_head=4), source="test")
    ran: list[int] = []
    adapter.model.register_forward_pre_hook(lambda module, args: ran.append(1))
    ids = np.random.default_rng(0).integers(0, 97, size=(3, t))
    monkeypatch.setattr(memory, "memory_of", lambda device=None: 20 << 20)
    options = {"resolution": 16, "batch_size": 1, "progress": False, "streamed": True}
    before = len(ran)
    refused = (r"^a summary of 2 layers whose rows are streamed .* needs about 22\.0 MiB of memory, more than the "
               r"20\.0 MiB this machine has; ask for fewer layers")  # fmt: skip
    with pytest.raises(BiasvizError, match=refused):
        summarise(adapter, ids, [0, 1], torch.device("cpu"), **options)
    assert len(ran) - before <= 1  # at most the rotary check's short pass: no sample's forward
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = summarise(adapter, ids, [1], torch.device("cpu"), **options)
    assert set(got) == {1}
