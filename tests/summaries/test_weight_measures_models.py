"""docs/position-measures.md's weight measures in summaries, against float64 math from the q and k caught at the model's
own attention call (not through biasviz): our rotary model (its rows formed again), a sliding-window transformers model
through SDPA (formed again) and through eager attention (streamed as the model forms them)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.common.shapes import gpu_shapes
from biasviz.model import capture
from biasviz.store.datasets import distance_bins
from biasviz.store.reader import open_bias_file
from tests.conftest import small_model
from tests.measures_reference import map_se, reference, sink_ranking
from tests.summaries.test_attended_cells import HEADS, KV_HEADS, VOCAB, WINDOW, caught_call

N, T, RESOLUTION = 4, 48, 12  # blocks of 4 positions


def hooked_qk(model: torch.nn.Module, layer: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q and k (N, H, T, hd) float64 as the model's attention call receives them, read at its hook points in a
    plain forward (not through biasviz's extraction)."""
    got: dict[str, torch.Tensor] = {}
    names = [f"blocks.{layer}.attn.hook_q", f"blocks.{layer}.attn.hook_k"]
    with capture(model, names, lambda t, name, _r: got.update({name.rsplit("_", 1)[1]: t})), torch.no_grad():
        model(torch.from_numpy(ids))
    q, k = (got[x].double().numpy().transpose(0, 2, 1, 3) for x in ("q", "k"))
    return q, k


def interleaved_rotary(seed: int, length: int, ids_seed: int) -> tuple[torch.nn.Module, torch.Tensor, dict]:
    """A one-layer GPT-J through SDPA (4 heads, rotary_dim 4: pairs (2f, 2f + 1), the rest unrotated), N samples of
    ``length`` tokens, and the q, k and scale caught at its SDPA call."""
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(seed)
    config = GPTJConfig(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=1, n_head=4, rotary_dim=4,
                        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")  # fmt: skip
    model = GPTJForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (N, length), generator=torch.Generator().manual_seed(ids_seed))
    return model, ids, caught_call(model, ids)


def softmax_weights(q: np.ndarray, k: np.ndarray, scale: float, kept: np.ndarray) -> np.ndarray:
    """(N, H, T, T) softmax of c q k over the attended cells, 0 elsewhere."""
    z = np.where(kept, scale * np.einsum("nhid,nhjd->nhij", q, k), -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def profile_se(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(N, H, T, T) values, (H or 1, T, T) attended cells -> (H, T) SE over samples of each sample's mean at each
    distance i - j = d >= 0 over the attended cells (NaN where none)."""
    n, h, t, _ = x.shape
    m = np.broadcast_to(mask, (h, t, t))
    d = np.subtract.outer(np.arange(t), np.arange(t))
    per = np.full((n, h, t), np.nan)
    for hh in range(h):
        for dist in range(t):
            cells = m[hh] & (d == dist)
            if cells.any():
                per[:, hh, dist] = x[:, hh][:, cells].mean(-1)
    return np.sqrt(((per - per.mean(0)) ** 2).sum(0) / (n * (n - 1)))


def check_file(path: Path, layer: int, w: np.ndarray, mask: np.ndarray, scores: np.ndarray | None = None) -> None:
    """Every docs/position-measures.md weight measure of ``layer`` in ``path`` equals the reference from ``w``, and the
    profiles' SEs those of the weights and (given) the scores."""
    f = open_bias_file(path)
    np.testing.assert_allclose(f.summary_array("weights_profile_se", layer), profile_se(w, mask), rtol=2e-4,
                               atol=1e-7)  # fmt: skip
    if scores is not None:
        np.testing.assert_allclose(f.summary_array("scores_profile_se", layer), profile_se(scores, mask),
                                   rtol=2e-4, atol=1e-6)  # fmt: skip
    block = f.block
    np.testing.assert_allclose(f.summary_array("weights_mean_se", layer), map_se(w, mask, block), rtol=2e-4,
                               atol=1e-7, equal_nan=True)  # fmt: skip
    if scores is not None:
        np.testing.assert_allclose(f.summary_array("scores_mean_se", layer), map_se(scores, mask, block), rtol=2e-4,
                                   atol=1e-6, equal_nan=True)  # fmt: skip
    ref = reference(w, mask, block)
    n = w.shape[0]
    for name in ("band_mass", "context_mass", "weights_entropy", "attention_distance"):
        x = ref[name]
        got = f.summary_array(name, layer)
        np.testing.assert_allclose(got[0], x.mean(0), rtol=2e-5, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(got[1], x.std(0), rtol=2e-4, atol=2e-6, err_msg=name)
        se = np.sqrt(((x - x.mean(0)) ** 2).sum(0) / (n * (n - 1)))
        np.testing.assert_allclose(f.summary_array(f"{name}_se", layer), se, rtol=2e-4, atol=2e-6, err_msg=name)
    recv = np.nan_to_num(ref["received"], nan=-1.0)
    sinks = f.summary_array("sink_keys", layer)
    _, share, least = sink_ranking(ref["received"], ref["seen"])
    np.testing.assert_allclose(sinks["share"], share, rtol=2e-5, atol=1e-7)
    picked = np.take_along_axis(recv, sinks["index"].astype(np.int64), -1)
    np.testing.assert_allclose(picked, sinks["share"], rtol=2e-5, atol=1e-7)  # the index is the key with that share
    assert (f.summary.sink_min_queries(layer) == least).all()
    loo = np.stack([np.delete(ref["received"], a, 0).mean(0) for a in range(n)])
    jack = np.sqrt((n - 1) / n * ((loo - loo.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose(f.summary_array("weights_key_profile_se", layer), jack, rtol=2e-4, atol=1e-7)
    np.testing.assert_allclose(f.summary_array("sink_share_se", layer), jack[..., 0], rtol=2e-4, atol=1e-7)


def test_rotary_model_rows_formed_again(tmp_path: Path) -> None:
    model = small_model("rope")
    ids = np.random.default_rng(5).integers(0, 97, size=(N, T))
    layer = 1
    q, k = hooked_qk(model, layer, ids)
    mask = np.tril(np.ones((1, T, T), bool))
    c = float(model.blocks[layer].attn.scale)
    w = softmax_weights(q, k, c, mask[None])
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[layer], summary=True, resolution=RESOLUTION, device="cpu",
                    progress=False)  # fmt: skip
    check_file(out, layer, w, mask, c * np.einsum("nhid,nhjd->nhij", q, k))
    check_diagnose(out, w, mask)


def check_diagnose(path: Path, w: np.ndarray, mask: np.ndarray) -> None:
    """``diagnose --json`` lists each head's top keys and the secondary sinks (top key not 0) as the reference has
    them, and each measure with its SE."""
    from click.testing import CliRunner

    from biasviz.cli import cli

    out = path.parent / "d.json"
    result = CliRunner().invoke(cli, ["diagnose", str(path), "--no-figures", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = next(iter(json.loads(out.read_text())["schemes"].values()))
    ref = reference(w, mask, 1)
    index, share, _ = sink_ranking(ref["received"].mean(0, keepdims=True), ref["seen"])  # of the mean over samples
    top, held = index[0, :, 0], share[0, :, 0]
    assert doc["sinks"]["secondary_sink_heads"] == [h for h in range(len(top)) if top[h] != 0 and held[h] >= 0.3]
    assert [row[0]["key"] for row in doc["sinks"]["top_keys_per_head"]] == top.tolist()
    x = ref["band_mass"]
    se = np.sqrt(((x - x.mean(0)) ** 2).sum(0) / (len(x) * (len(x) - 1)))
    np.testing.assert_allclose(np.asarray(doc["measures"]["band_mass"]["se"], float), se, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_sliding_window_model(tmp_path: Path, attention: str) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           num_hidden_layers=1, intermediate_size=64, vocab_size=VOCAB, sliding_window=WINDOW,
                           max_position_embeddings=64, attn_implementation="sdpa")  # fmt: skip
    model = MistralForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(2))
    call = caught_call(model, ids)
    kept = call["kept"].numpy()
    q, k, c = call["q"].numpy(), call["k"].numpy(), float(call["scale"])
    w = softmax_weights(q, k, c, kept)
    model.set_attn_implementation(attention)
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, summary=True, resolution=RESOLUTION, progress=False)
    check_file(out, 0, w, kept[0], c * np.einsum("nhid,nhjd->nhij", q, k))
    check_diagnose(out, w, kept[0])
    f = open_bias_file(out)  # Mistral rotates half-split over every dim: P by pair over the window's cells
    half = q.shape[-1] // 2
    np.testing.assert_allclose(f.summary_array("frequency_use", 0)[0],
                               np.hypot(q[..., :half], q[..., half:]).mean(2).mean(0), rtol=1e-5)  # fmt: skip
    # P's map SE over the window's cells: formed again from the bank (SDPA), or from the q and k kept as the model
    # streamed them (eager)
    from tests.summaries.test_positional_blocks import jackknife_p

    r = {"q": q, "k": k, "bias": np.zeros((N, q.shape[1], T, T)), "scale": c}
    np.testing.assert_allclose(f.summary_array("positional_mean_se", 0), jackknife_p(r, kept[0], f.block),
                               rtol=1e-3, atol=1e-6, equal_nan=True)  # fmt: skip
    if attention == "sdpa":  # formed again from the bank: P split by pair (the streamed path stores no split)
        groups = [np.array([f_, f_ + half]) for f_ in range(half)]
        np.testing.assert_allclose(f.summary_array("positional_frequency", 0),
                                   _split_reference(q, k, c, groups, T, WINDOW), rtol=1e-4, atol=1e-7,
                                   equal_nan=True)  # fmt: skip


def test_two_samples_store_no_standard_error(tmp_path: Path) -> None:
    model = small_model("alibi")
    ids = np.random.default_rng(1).integers(0, 97, size=(2, 16))
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[0], summary=True, device="cpu", progress=False)
    held = open_bias_file(out).summary_datasets(0)
    assert "band_mass" in held and not [name for name in held if name.endswith("_se")]


def test_bands_and_context_figures_draw_the_stored_means_and_their_95_bands(tmp_path: Path) -> None:
    """What is drawn is read back: each panel's line is the stored mean (bands: over each bin's width), its shaded
    band mean ± 1.96 SE from the stored SE."""
    from biasviz.plotting.measures_plots import bands_figure, context_figure

    model = small_model("alibi")
    ids = np.random.default_rng(7).integers(0, 97, size=(5, 40))
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[1], summary=True, device="cpu", progress=False)
    f = open_bias_file(out)
    bins = f.summary.distance_bins()
    width = bins[:, 1] - bins[:, 0] + 1
    for draw, name, scale in ((bands_figure, "band_mass", width), (context_figure, "context_mass", 1)):
        fig = draw(f, 1, scheme="alibi")
        mean, se = f.summary_array(name, 1)[0], f.summary_array(f"{name}_se", 1)
        for h, ax in enumerate(a for a in fig.axes if a.get_visible()):
            np.testing.assert_allclose(ax.lines[0].get_ydata(), mean[h] / scale, rtol=1e-6)
            band = ax.collections[0].get_paths()[0].vertices[:, 1]
            top = (mean[h] + 1.959963984540054 * se[h]) / scale
            assert np.isclose(band.max(), top.max(), rtol=1e-6), (name, h)


@pytest.mark.parametrize("scheme", ["cable", "alibi"])
def test_bias_profile_and_map_se_from_each_samples_bias(tmp_path: Path, scheme: str) -> None:
    """CABLE's bias depends on the text: its profile's and map's SEs are those of each sample's own bias (a full
    extract's), at blocks of one position (from the stored spread) and of several (each sample's block means);
    ALiBi's is measured the same in every sample: SE 0."""
    from tests.summaries.test_position import _reference, _windows

    model = small_model(scheme)
    ids = _windows()
    t = ids.shape[1]
    r = _reference(model, ids, tmp_path, layer=1)
    mask = np.tril(np.ones((1, t, t), bool))
    bias = np.nan_to_num(r["bias"])
    for resolution in (t, t // 3):
        out = tmp_path / f"s{resolution}.h5"
        biasviz.extract(model, ids, out, layers=[1], summary=True, resolution=resolution, device="cpu",
                        progress=False)  # fmt: skip
        f = open_bias_file(out)
        got = f.summary_array("bias_profile_se", 1)
        np.testing.assert_allclose(got, profile_se(bias, mask), rtol=2e-4, atol=1e-6)
        assert (got > 1e-4).any() == (scheme == "cable")
        mean_se = f.summary_array("bias_mean_se", 1)
        np.testing.assert_allclose(mean_se, map_se(bias, mask, f.block), rtol=2e-4, atol=1e-6, equal_nan=True)
        assert (mean_se > 1e-4).any() == (scheme == "cable")


def _split_reference(q: np.ndarray, k: np.ndarray, c: float, groups: list[np.ndarray], t: int,
                     window: int | None = None) -> np.ndarray:  # fmt: skip
    """(N, H, T, hd) -> (H, groups, bins): P restricted to each group of dims (the mean over ordered pairs of
    different texts of c q_a(i)·k_b(j)), averaged over each distance bin's causal cells (within ``window``)."""
    n = len(q)
    bins = distance_bins(t)
    d = np.subtract.outer(np.arange(t), np.arange(t))
    out = np.zeros((q.shape[1], len(groups), len(bins)))
    for g, dims in enumerate(groups):
        p = np.mean([c * np.einsum("hid,hjd->hij", q[a][..., dims], k[b][..., dims])
                     for a in range(n) for b in range(n) if a != b], axis=0)  # fmt: skip
        for bi, (lo, hi) in enumerate(bins):
            cells = (d >= lo) & (d <= hi) & (d < (window or t))
            out[:, g, bi] = p[:, cells].mean(-1) if cells.any() else np.nan
    return out


def _check_positional_frequency(path: Path, layer: int, q: np.ndarray, k: np.ndarray, c: float,
                                groups: list[np.ndarray]) -> None:  # fmt: skip
    t = q.shape[2]
    f = open_bias_file(path)
    got = f.summary_array("positional_frequency", layer)
    np.testing.assert_allclose(got, _split_reference(q, k, c, groups, t), rtol=1e-4, atol=1e-7)
    n = len(q)  # the jackknife from scratch: every delete-one P formed again from the other texts
    left = np.stack([_split_reference(np.delete(q, a, 0), np.delete(k, a, 0), c, groups, t) for a in range(n)])
    jack = np.sqrt((n - 1) / n * ((left - left.mean(0)) ** 2).sum(0))
    np.testing.assert_allclose(f.summary_array("positional_frequency_se", layer), jack, rtol=1e-3, atol=1e-7)
    with h5py.File(path) as h5:
        assert h5[f"layer_{layer}/positional_frequency"].attrs["pair_sum_residual"] < 1e-5
    # P's distance profile (no additive bias: P is the sum over every dim), its jackknife SE from scratch
    every = [np.concatenate(groups)]
    d = np.subtract.outer(np.arange(t), np.arange(t))

    def by_distance(qq: np.ndarray, kk: np.ndarray) -> np.ndarray:
        m = len(qq)
        p = np.mean([c * np.einsum("hid,hjd->hij", qq[a][..., every[0]], kk[b][..., every[0]])
                     for a in range(m) for b in range(m) if a != b], axis=0)  # fmt: skip
        late = np.arange(t)[None, :] >= 4  # the profile's second row: keys j >= 4
        rest = [p[:, (d == dist) & late].mean(-1) if ((d == dist) & late).any() else np.full(len(p), np.nan)
                for dist in range(t)]  # fmt: skip
        return np.stack([np.stack([p[:, d == dist].mean(-1) for dist in range(t)], -1), np.stack(rest, -1)])

    left_p = np.stack([by_distance(np.delete(q, a, 0), np.delete(k, a, 0)) for a in range(n)])
    jack_p = np.sqrt((n - 1) / n * ((left_p - left_p.mean(0)) ** 2).sum(0))
    got = f.summary_array("positional_profile_se", layer)
    assert got.shape == f.summary_array("positional_profile", layer).shape  # shaped like its mean: (from_key, H, T)
    np.testing.assert_allclose(got, jack_p, rtol=1e-3, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("shapes", ["cpu", "gpu"])
def test_positional_frequency_of_a_partial_half_split_rotary_model(tmp_path: Path, shapes: str) -> None:
    """P split by pair (f, f + d_rot/2) and the unrotated dims, by distance bin, and its jackknife SE; a head at a
    time (a CPU's shapes) or every head at once (a GPU's)."""
    model = small_model("rope", scheme_options={"fraction": 0.5})
    ids = np.random.default_rng(8).integers(0, 97, size=(N, 30))
    q, k = hooked_qk(model, 1, ids)
    rotated, hd = int(model.blocks[1].attn.pos_bias.rotary_dim), q.shape[-1]
    half = rotated // 2
    groups = [np.array([f, f + half]) for f in range(half)] + [np.arange(rotated, hd)]
    out = tmp_path / "s.h5"
    with gpu_shapes() if shapes == "gpu" else contextlib.nullcontext():
        biasviz.extract(model, ids, out, layers=[1], summary=True, device="cpu", progress=False)
    _check_positional_frequency(out, 1, q, k, float(model.blocks[1].attn.scale), groups)


@pytest.mark.parametrize("shapes", ["cpu", "gpu"])
def test_positional_frequency_of_an_interleaved_rotary_model(tmp_path: Path, shapes: str) -> None:
    model, ids, call = interleaved_rotary(1, 24, 4)
    out = tmp_path / "s.h5"
    with gpu_shapes() if shapes == "gpu" else contextlib.nullcontext():
        biasviz.extract(model, ids, out, summary=True, progress=False)
    groups = [np.array([0, 1]), np.array([2, 3]), np.arange(4, 8)]
    _check_positional_frequency(out, 0, call["q"].numpy(), call["k"].numpy(), float(call["scale"]), groups)


def test_diagnose_json_gives_the_rotary_measures_and_their_standard_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from biasviz.cli import cli

    model = small_model("rope", scheme_options={"fraction": 0.5})
    ids = np.random.default_rng(9).integers(0, 97, size=(N, 24))
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[1], summary=True, device="cpu", progress=False)
    result = CliRunner().invoke(cli, ["diagnose", str(out), "--no-figures", "--json", str(tmp_path / "d.json")])
    assert result.exit_code == 0, result.output
    doc = next(iter(json.loads((tmp_path / "d.json").read_text())["schemes"].values()))["measures"]
    f = open_bias_file(out)
    np.testing.assert_allclose(np.asarray(doc["frequency_use"]["k"], float), f.summary_array("frequency_use", 1)[1],
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(np.asarray(doc["positional_frequency"]["se"], float),
                               f.summary_array("positional_frequency_se", 1), rtol=1e-6)  # fmt: skip


def test_extract_says_why_no_rotary_measures_are_stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from biasviz.cli.extract_cmd import _summarised

    for scheme, said in (("alibi", "no rotary module was found"), ("rope", None)):
        out = tmp_path / f"{scheme}.h5"
        ids = np.random.default_rng(2).integers(0, 97, size=(3, 16))
        biasviz.extract(small_model(scheme), ids, out, layers=[1], summary=True, device="cpu", progress=False)
        listed = _summarised(out, 1, scheme)
        err = capsys.readouterr().err
        assert ("rotary frequencies" in listed) == (said is None)
        assert (said in err) if said else "note" not in err
