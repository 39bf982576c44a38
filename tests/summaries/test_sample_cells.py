"""Summaries of calls that mask each sample differently (docs/hdf5.md, 'Attended cells'): left padding, packed
documents.

Each sample's own cells count for it: a cell's mean and spread are over the samples that attend it, the maps,
profiles and diagnostics average the cells some sample attends, the key profile and sink shares count each
sample's own queries. The reference is float64 numpy on the q, k, scale, additive part and mask caught at the
model's own SDPA call in a plain forward (torch's function wrapped here, not through biasviz).
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
from tests.measures_reference import block_means as sample_block_means
from tests.measures_reference import reference as measures_reference
from tests.measures_reference import sink_ranking
from tests.summaries.test_attended_cells import diagnostics

T, N, HEADS, VOCAB = 16, 3, 4, 64


def caught_call(forward: Any) -> dict[str, np.ndarray]:
    """q, k (key heads repeated), scale, additive part and attended cells (N, H, T, T) of the one SDPA call."""
    seen: dict[str, Any] = {}
    original = torch.nn.functional.scaled_dot_product_attention

    def wrapped(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kw):
        groups = q.shape[1] // k.shape[1]
        seen["q"], seen["k"] = q.double(), k.repeat_interleave(groups, dim=1).double()
        seen["scale"] = q.shape[-1] ** -0.5 if scale is None else scale
        shape = (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
        i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
        kept = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool) & ((j <= i) if is_causal else True)
        added = torch.zeros(shape, dtype=torch.float64)
        if attn_mask is not None:
            kept = kept & (attn_mask if attn_mask.dtype == torch.bool else attn_mask > -1e9)
            if attn_mask.dtype != torch.bool:
                added = torch.broadcast_to(torch.where(attn_mask > -1e9, attn_mask, 0.0).double(), shape)
        seen["kept"], seen["added"] = torch.broadcast_to(kept, shape), added
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa, **kw)  # fmt: skip

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        with torch.no_grad():
            forward()
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    return {name: np.asarray(value.numpy() if torch.is_tensor(value) else value) for name, value in seen.items()}


def per_cell(values: np.ndarray, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(H, T, T) mean and population spread of each cell over the samples that attend it; NaN where none does."""
    n = kept.sum(0)
    mean = np.where(kept, values, 0.0).sum(0) / np.maximum(n, 1)
    spread = np.sqrt(np.where(kept, (values - mean) ** 2, 0.0).sum(0) / np.maximum(n, 1))
    return np.where(n > 0, mean, np.nan), np.where(n > 0, spread, np.nan)


def block_means(cells: np.ndarray, union: np.ndarray, block: int) -> np.ndarray:
    """(H, T / block, T / block): the mean of each block's cells that some sample attends (NaN with none)."""
    h, t = cells.shape[0], cells.shape[-1] // block
    total = np.where(union, cells, 0.0).reshape(h, t, block, t, block).sum((2, 4))
    count = union.reshape(h, t, block, t, block).sum((2, 4))
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def kept_softmax(scores: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Each row's softmax over its kept cells, 0 elsewhere (and in a row with no kept cell)."""
    z = np.where(kept, scores, -np.inf)
    top = np.where(kept.any(-1, keepdims=True), z.max(-1, keepdims=True), 0.0)
    w = np.where(kept, np.exp(z - top), 0.0)
    return w / np.maximum(w.sum(-1, keepdims=True), 1e-300)


def reference(call: dict[str, np.ndarray], block: int, differ: bool = True) -> dict[str, np.ndarray]:
    """Every stored quantity, from the caught call by the rule of docs/hdf5.md, 'Attended cells' for masks that differ
    by sample (``differ``; else the rule for one mask, which it gives as well)."""
    kept, c = call["kept"], float(call["scale"])
    assert not differ or not (kept == kept[:1]).all(), "the samples' masks differ"
    scores = c * np.einsum("nhid,nhjd->nhij", call["q"], call["k"]) + call["added"]
    w = kept_softmax(scores, kept)
    union = kept.any(0)
    out: dict[str, np.ndarray] = {}
    d = np.subtract.outer(np.arange(T), np.arange(T))
    for kind, values in (("weights", w), ("scores", scores), ("bias", call["added"])):
        mean, spread = per_cell(values, kept)
        out[f"{kind}_mean"], out[f"{kind}_std"] = block_means(mean, union, block), block_means(spread, union, block)
        profile = np.full((2, HEADS, T), np.nan)
        for h in range(HEADS):
            for dist in range(T):
                cells = union[h] & (d == dist)
                if cells.any():
                    m, s = mean[h][cells], spread[h][cells]
                    profile[:, h, dist] = m.mean(), np.sqrt(max((s**2 + m**2).mean() - m.mean() ** 2, 0.0))
        out[f"{kind}_profile"] = profile
        out[f"{kind}_cells"] = mean
    seen = kept.sum((0, 2)).astype(float)  # (H, T): (sample, query) pairs that see each key
    key_mean = w.sum((0, 2)) / seen
    key_sq = (w**2).sum((0, 2)) / seen
    out["weights_key_profile"] = np.stack([key_mean, np.sqrt(np.maximum(key_sq - key_mean**2, 0.0))])
    with np.errstate(invalid="ignore"):
        out["sink_share"] = w[..., 0].sum(-1) / kept[..., 0].sum(-1)  # (N, H): NaN where no query sees key 0
    out["attended"] = union.reshape(HEADS, T // block, block, T // block, block).mean((2, 4))
    out["union"] = union
    # section 14: each sample's measures over its own cells (the reference of one mask, sample by sample), then the
    # mean, spread and SE over the samples that have a value
    per_sample = [measures_reference(w[a : a + 1], kept[a], block) for a in range(len(w))]
    for name in ("band_mass", "context_mass", "weights_entropy", "received", "attention_distance"):
        x = np.concatenate([one[name] for one in per_sample])
        out[name], out[f"{name}_se"] = over_samples(x)
        out[f"{name}_each"] = x
    ranked = [sink_ranking(one["received"], one["seen"]) for one in per_sample]  # each sample's own rule
    out["sink_keys_index"], out["sink_keys_share"] = (np.concatenate([r[i] for r in ranked]) for i in (0, 1))
    out["sink_min_queries"] = np.stack([r[2] for r in ranked])  # (N, H)
    out["weights_key_profile_se"], out["sink_share_se"] = out["received_se"], out["received_se"][..., 0]
    slot = np.subtract.outer(np.arange(T), np.arange(T))  # i - j
    # a causal call's profile SEs run over d = i - j >= 0, a bidirectional one's over i - j from -(T - 1)
    signed = range(-(T - 1), T) if (kept & (slot < 0)).any() else range(T)
    for kind, values in (("weights", w), ("scores", scores), ("bias", call["added"])):
        # the maps' SE: over each sample's mean over its own attended cells of each block
        per_block = np.concatenate([sample_block_means(values[a : a + 1], kept[a], block) for a in range(len(w))])
        out[f"{kind}_mean_se"] = over_samples(per_block)[1]
    for kind, values in (("weights", w), ("scores", scores)):
        own = np.full((len(w), HEADS, len(signed)), np.nan)
        for k, dist in enumerate(signed):
            cells = kept & (slot == dist)
            with np.errstate(invalid="ignore"):
                own[..., k] = np.where(cells, values, 0.0).sum((2, 3)) / cells.sum((2, 3))
        out[f"{kind}_profile_se"] = over_samples(own)[1]
    return out


def over_samples(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample values (N, ...) -> ((2, ...) mean and std, SE) over the samples with a value; SE NaN below 3."""
    held = ~np.isnan(x)
    n = held.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(held, x, 0.0).sum(0) / n
        dev2 = np.where(held, x - mean, 0.0) ** 2
        se = np.where(n >= 3, np.sqrt(dev2.sum(0) / (n * (n - 1))), np.nan)
        return np.stack([mean, np.sqrt(dev2.sum(0) / n)]), se


class Packed(torch.nn.Module):
    """Documents packed into each window, a sample's own boundaries: a query sees the earlier keys of its own
    document, with an additive bias by the distance within it and by the key's place in its document."""

    def __init__(self, starts: dict[tuple[int, ...], list[int]]) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HEADS * 8)
        self.starts = starts

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).view(*ids.shape, HEADS, 8).transpose(1, 2)
        t = ids.shape[-1]
        doc = torch.stack([torch.bucketize(torch.arange(t), torch.tensor(self.starts[tuple(r.tolist())]), right=True)
                           for r in ids])  # fmt: skip
        place = torch.arange(t) - torch.stack([torch.tensor(self.starts[tuple(r.tolist())])[d - 1] for r, d in
                                               zip(ids, doc, strict=True)])  # fmt: skip
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        kept = (j <= i) & (doc[:, :, None] == doc[:, None, :])  # (B, T, T)
        bias = -0.1 * (i - j).float() - 0.05 * place[:, None, :].float()
        mask = torch.where(kept, bias, float("-inf"))[:, None]
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


class PaddedEncoder(torch.nn.Module):
    """A bidirectional call (an encoder) whose samples are padded on the right, as BERT's are: every query sees
    every real key of its sample, with an additive bias that is not a function of i - j alone."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HEADS * 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).view(*ids.shape, HEADS, 8).transpose(1, 2)
        t = ids.shape[-1]
        i, j = torch.arange(t)[:, None].float(), torch.arange(t)[None, :].float()
        bias = -0.1 * (i - j).abs() + 0.3 * torch.sin(i) * torch.cos(0.5 * j)
        mask = torch.where((ids != 0)[:, None, None, :], bias, float("-inf"))  # (B, 1, T, T)
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def _padded_encoder() -> tuple[torch.nn.Module, torch.Tensor, None]:
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(9))
    ids[1, -5:] = 0
    ids[2, -2:] = 0
    torch.manual_seed(2)
    return PaddedEncoder().eval(), ids, None


def _packed() -> tuple[torch.nn.Module, torch.Tensor, None]:
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(7))
    starts = [[0], [0, 5], [0, 3, 11]]  # one document, then two, then three
    torch.manual_seed(1)
    return Packed({tuple(r.tolist()): s for r, s in zip(ids, starts, strict=True)}).eval(), ids, None


def _left_padded() -> tuple[torch.nn.Module, torch.Tensor, Any]:
    """A transformers Llama given an attention_mask with left padding (its rows are formed again without it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
                         attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(N, T, dtype=torch.long)
    pad[1, :4] = 0
    pad[2, :7] = 0
    rows = {tuple(r.tolist()): k for k, r in enumerate(ids)}

    def forward(batch: torch.Tensor) -> Any:
        return model(batch, attention_mask=pad[[rows[tuple(r.tolist())] for r in batch]])

    return model, ids, forward


MODELS = {"packed documents": _packed, "left padding": _left_padded, "padded encoder": _padded_encoder}


@pytest.fixture(scope="module", params=[(name, batch, r) for name in MODELS for batch, r in ((1, T), (N, T // 2))],
                ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A summary in batches of one (the masks differ from the second batch on: the layer turns to per-sample
    counting part-way) and in one batch (they differ within it), exact cells and blocks of two."""
    name, batch, resolution = request.param
    model, ids, forward = MODELS[name]()
    call = caught_call(lambda: forward(ids) if forward is not None else model(ids))
    out = tmp_path_factory.mktemp("masks") / "s.h5"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        biasviz.extract(model, ids, out, summary=True, progress=False, batch_size=batch, resolution=resolution,
                        forward=forward)  # fmt: skip
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
        attrs = {"note": f["layer_0"].attrs.get("note"), "mask": f.attrs["mask"],
                 "sink_min_queries": f["layer_0/sink_keys"].attrs["sink_min_queries"]}
    return {"name": name, "stored": stored, "attrs": attrs, "warnings": [str(w.message) for w in caught],
            "expected": reference(call, T // resolution)}


NAMES = ["weights_mean", "weights_std", "weights_profile", "scores_mean", "scores_std", "scores_profile",
         "weights_key_profile", "sink_share", "attended"]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_each_sample_counts_its_own_cells(summarised: dict[str, Any], name: str) -> None:
    got, want = summarised["stored"][name], summarised["expected"][name]
    assert np.array_equal(np.isnan(got), np.isnan(want)), name  # no sample attends: NaN, and only there
    atol = 1e-5 if name in ("weights_key_profile", "scores_std", "weights_std") else 2e-6
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=atol, equal_nan=True)


def test_the_bias_and_its_diagnostics(summarised: dict[str, Any]) -> None:
    """The additive part (packed: by distance and place in a document; the encoder's, not of i - j alone): maps and
    profile over each sample's own cells; the Toeplitz and separability residuals of the mean bias over the cells
    some sample attends (an encoder's on both sides of the diagonal)."""
    if summarised["name"] == "left padding":
        pytest.skip("the padded Llama adds no bias")
    stored, expected = summarised["stored"], summarised["expected"]
    for name in ("bias_mean", "bias_std", "bias_profile"):
        np.testing.assert_allclose(stored[name], expected[name], rtol=2e-5, atol=2e-6, equal_nan=True)
    cells, union = expected["bias_cells"], expected["union"]
    want = np.array([diagnostics(np.nan_to_num(cells[h]), union[h]) for h in range(HEADS)])
    got = np.array([[row["toeplitz_residual"], row["separability_residual"]] for row in stored["diagnostics"]])
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.parametrize("name", ["band_mass", "context_mass", "weights_entropy", "attention_distance"])
def test_section_14_measures_are_over_each_sample_s_own_cells(summarised: dict[str, Any], name: str) -> None:
    """Band and context mass (the keys each query sees in its own sample: within its document) and entropy, with
    spread and SE over the samples that have a value."""
    stored, expected = summarised["stored"], summarised["expected"]
    np.testing.assert_allclose(stored[name], expected[name], rtol=2e-5, atol=2e-6, equal_nan=True)
    np.testing.assert_allclose(stored[f"{name}_se"], expected[f"{name}_se"], rtol=2e-4, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("name", ["weights_profile_se", "scores_profile_se", "weights_key_profile_se",
                                  "sink_share_se"])  # fmt: skip
def test_standard_errors_over_each_sample_s_own_cells(summarised: dict[str, Any], name: str) -> None:
    stored, expected = summarised["stored"], summarised["expected"]
    np.testing.assert_allclose(stored[name], expected[name], rtol=2e-4, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("kind", ["weights", "scores", "bias"])
def test_the_maps_standard_errors_over_each_sample_s_own_block_means(summarised: dict[str, Any], kind: str) -> None:
    """A sample's block mean is over its own attended cells of the block; the SE over the samples with a value
    (NaN below 3), shaped like the map (docs/position-measures.md, 'Standard errors')."""
    if kind == "bias" and summarised["name"] == "left padding":
        pytest.skip("the padded Llama adds no bias")
    stored, expected = summarised["stored"], summarised["expected"]
    got = stored[f"{kind}_mean_se"]
    assert got.shape == stored[f"{kind}_mean"].shape
    assert np.array_equal(np.isnan(got), np.isnan(expected[f"{kind}_mean_se"]))
    np.testing.assert_allclose(got, expected[f"{kind}_mean_se"], rtol=2e-4, atol=1e-6, equal_nan=True)


def test_sink_keys_rank_each_sample_s_own_queries(summarised: dict[str, Any]) -> None:
    """Among the keys that at least ceil(m / 8) of each sample's own queries see, m the most any of its keys is
    seen by; the file records that number per sample and head."""
    expected = summarised["expected"]
    sinks = summarised["stored"]["sink_keys"]
    np.testing.assert_allclose(sinks["share"], expected["sink_keys_share"], rtol=2e-5, atol=1e-7, equal_nan=True)
    least = summarised["attrs"]["sink_min_queries"]
    assert (np.broadcast_to(least, expected["sink_min_queries"].shape) == expected["sink_min_queries"]).all()


def test_what_needs_one_mask_is_left_out_and_said(summarised: dict[str, Any]) -> None:
    """P pairs the cells of different samples as one grid: not stored, nor what derives from it, and the layer, the
    file and a warning say why."""
    stored, attrs = summarised["stored"], summarised["attrs"]
    assert not {"positional_mean", "positional_profile", "positional_mean_se", "positional_profile_se"} & set(stored)
    assert "samples masked differently" in attrs["note"] and "positional logits P" in attrs["note"]
    assert "not stored" in attrs["note"]
    assert attrs["mask"] == "model"
    assert any("samples masked differently" in w for w in summarised["warnings"])


def test_a_layer_note_from_a_file_is_shown_as_plain_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file's note is data: control characters never reach the terminal, and an overlong one is cut."""
    from tests.conftest import run_cli

    model, ids, _ = _packed()
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False)
    with h5py.File(out, "a") as f:
        f["layer_0"].attrs["note"] = "\x1b]0;owned\x07\x1b[31m<b>red</b>" + "x" * 1000
    code, text, err = run_cli(["info", str(out)], capsys)
    assert code == 0, err
    line = next(line for line in text.splitlines() if "layer_0 note" in line)
    assert "\x1b" not in line and "\x07" not in line and "<b>red</b>" in line
    assert line.endswith("...") and len(line) < 500
    assert "mask            the model's own in some layers" in text  # the root rule, said once


@pytest.mark.parametrize("batch", [1, N])
def test_padding_in_a_model_formed_again_is_formed_again_block_by_block(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, batch: int
) -> None:
    """A Llama given left padding keeps each sample's mask beside its q and k and forms its rows again, a few rows
    at a time (memory one block, not the streamed (B, H, T, T) matrices): every quantity as the reference has it."""
    import biasviz.extraction.summary as summary
    import biasviz.summaries.replay as replay

    def streamed(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("streamed instead of formed again")

    monkeypatch.setattr(summary, "_streamed", streamed)
    monkeypatch.setattr(replay, "MIN_REPLAY_ROWS", 1)
    monkeypatch.setattr(replay, "REPLAY_BYTES", 3 * HEADS * T * (replay.CELL_BYTES + replay.SAMPLE_CELL_BYTES))
    model, ids, forward = _left_padded()
    call = caught_call(lambda: forward(ids))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        biasviz.extract(model, ids, out, summary=True, progress=False, batch_size=batch, resolution=T // 2,
                        forward=forward)  # fmt: skip
    assert any("samples masked differently" in str(w.message) for w in caught)
    expected = reference(call, 2)
    with h5py.File(out, "r") as f:
        layer = f["layer_0"]
        assert "samples masked differently" in layer.attrs["note"] and "positional_mean" not in layer
        for name in [*NAMES, "band_mass", "context_mass", "weights_entropy", "weights_profile_se"]:
            np.testing.assert_allclose(layer[name][()], expected[name], rtol=2e-5, atol=1e-5, equal_nan=True,
                                       err_msg=name)  # fmt: skip
