"""A transformers Llama given left padding that differs by sample, through SDPA and eager attention (docs/hdf5.md,
'Attended cells', and docs/position-measures.md): each sample's own cells count for it, a query row its mask leaves with
no key counts in nothing (eager code gives such a row a uniform softmax over the masked keys: it is no attention), a map
cell some sample's mask removes holds the mean over the samples that attend it, with their number beside it
(``attending_samples``), and P, which pairs the cells of different samples as one grid, is left out with a note saying
why. The reference is float64 numpy on the q, k, scale and mask the model hands its own attention call (caught here, not
through biasviz)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 4
PADS = (0, 6, 3, 0)  # left padding of each sample


def _model(implementation: str) -> tuple[torch.nn.Module, torch.Tensor, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=64,
                         attn_implementation=implementation)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(3))
    _, forward = left_padded(model, ids, PADS)
    return model, ids, forward


def left_padded(model: torch.nn.Module, ids: torch.Tensor, pads: tuple[int, ...]) -> tuple[torch.Tensor, Any]:
    """Sample a's first ``pads[a]`` positions padded: the ``attention_mask`` (N, T) and a forward that hands the model
    each batch's rows of it, found by their tokens (a summary runs the samples in batches of its own)."""
    pad = torch.ones(ids.shape, dtype=torch.long)
    for a, p in enumerate(pads):
        pad[a, :p] = 0
    rows = {tuple(r.tolist()): a for a, r in enumerate(ids)}

    def forward(batch: torch.Tensor) -> Any:
        return model(batch, attention_mask=pad[[rows[tuple(r.tolist())] for r in batch]])

    return pad, forward


def caught_eager(forward: Any) -> dict[str, np.ndarray]:
    """As :func:`caught_call`, at transformers' eager attention function: its q, k, scaling and additive mask."""
    from transformers.models.llama import modeling_llama

    seen: dict[str, Any] = {}
    original = modeling_llama.eager_attention_forward

    def wrapped(module, query, key, value, attention_mask, scaling, *args, **kwargs):  # noqa: ANN001, ANN202
        groups = query.shape[1] // key.shape[1]
        shape = (query.shape[0], query.shape[1], query.shape[-2], key.shape[-2])
        seen["q"], seen["k"] = query.double(), key.repeat_interleave(groups, dim=1).double()
        seen["scale"] = scaling
        seen["kept"] = torch.broadcast_to(attention_mask[..., : key.shape[-2]] > -1e9, shape)
        seen["added"] = torch.zeros(shape, dtype=torch.float64)
        return original(module, query, key, value, attention_mask, scaling, *args, **kwargs)

    modeling_llama.eager_attention_forward = wrapped
    try:
        with torch.no_grad():
            forward()
    finally:
        modeling_llama.eager_attention_forward = original
    return {name: np.asarray(value.numpy() if torch.is_tensor(value) else value) for name, value in seen.items()}


@pytest.fixture(scope="module", params=[(impl, batch) for impl in ("sdpa", "eager") for batch in (1, N)],
                ids=lambda p: f"{p[0]}, batch {p[1]}")  # fmt: skip
def padded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    implementation, batch = request.param
    model, ids, forward = _model(implementation)
    call = (caught_call if implementation == "sdpa" else caught_eager)(lambda: forward(ids))
    kept = call["kept"]
    assert not kept[1, :, : PADS[1]].any() and kept[0, :, : PADS[1]].any()  # sample 1's padded rows see no key
    out = tmp_path_factory.mktemp("padded") / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False, batch_size=batch, forward=forward)
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
        note = f["layer_0"].attrs.get("note")
    return {"stored": stored, "note": note, "expected": reference(call, 1), "kept": kept, "call": call}


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "context_mass", "weights_entropy", "attention_distance"])
def test_padded_rows_and_keys_count_in_nothing(padded: dict[str, Any], name: str) -> None:
    got, want = padded["stored"][name], padded["expected"][name]
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    assert np.isfinite(got[~np.isnan(got)]).all(), name  # no division by a count of zero
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5, equal_nan=True)


def test_a_cell_some_sample_removes_holds_the_mean_of_those_that_attend_it_and_their_number(
    padded: dict[str, Any],
) -> None:
    kept, stored = padded["kept"], padded["stored"]
    count = kept.sum(0).astype(float)  # (H, T, T) samples that attend each cell
    want = np.where(count > 0, count, np.nan)
    np.testing.assert_array_equal(stored["attending_samples"], want)
    removed = (count > 0) & (count < N)
    assert removed.any() and np.isfinite(stored["scores_mean"][removed]).all()


def test_p_pairs_one_grid_so_it_is_left_out_and_said(padded: dict[str, Any]) -> None:
    assert "positional_mean" not in padded["stored"] and "positional_profile" not in padded["stored"]
    assert "samples masked differently" in padded["note"] and "positional logits P" in padded["note"]


def test_frequency_use_over_each_sample_s_own_positions(padded: dict[str, Any]) -> None:
    """Llama rotates half-split: each pair's norm of q averaged over the queries that see some key, of k over the keys
    some query sees (padding left out), per sample; then the mean and SE over samples (docs/position-measures.md)."""
    call, kept, stored = padded["call"], padded["kept"], padded["stored"]
    half = call["q"].shape[-1] // 2
    per = []
    for x, at in ((call["q"], kept.any(-1)), (call["k"], kept.any(-2))):  # (N, H, T) positions that count
        norms = np.sqrt(x[..., :half] ** 2 + x[..., half:] ** 2)  # (N, H, T, pairs)
        per.append((norms * at[..., None]).sum(-2) / at.sum(-1)[..., None])
    per = np.stack(per, 1)  # (N, 2, H, pairs)
    got, se = stored["frequency_use"], stored["frequency_use_se"]
    assert se.shape == got.shape == per.shape[1:]
    np.testing.assert_allclose(got, per.mean(0), rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(se, per.std(0, ddof=1) / np.sqrt(N), rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_the_maps_standard_errors_in_blocks_over_each_sample_s_own_cells(tmp_path: Path, implementation: str) -> None:
    """Blocks of two positions: each sample's mean over its own attended cells of a block, the SE over the samples
    with a value (NaN below 3), shaped like the map; formed again (SDPA) and streamed (eager), masks differing from the
    second sample on."""
    model, ids, forward = _model(implementation)
    call = (caught_call if implementation == "sdpa" else caught_eager)(lambda: forward(ids))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False, batch_size=1, forward=forward,
                        resolution=T // 2)  # fmt: skip
    expected = reference(call, 2)
    with h5py.File(out, "r") as f:
        for kind in ("weights", "scores"):
            got = f[f"layer_0/{kind}_mean_se"][()]
            assert got.shape == f[f"layer_0/{kind}_mean"].shape
            want = expected[f"{kind}_mean_se"]
            assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).any() and np.isfinite(want).any()
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6, equal_nan=True, err_msg=kind)
