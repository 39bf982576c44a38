"""transformers' hooked models (BLOOM, MPT, Falcon with ALiBi, T5's encoder and decoder, GPT-2) summarised by forming
each layer's rows again from the q and k a forward kept (:class:`~biasviz.adapters.kept_calls.KeptCalls`), not by
holding each call's (H, T, T) matrices: the same file as the rows streamed whole, and weights whose mean and spread
are the library's own ``output_attentions``' (float64 numpy), for batches of 1 and of every sample."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from biasviz.extraction.summary import extract_summary
from tests.adapters import tiny_transformers
from tests.adapters.tiny_transformers import VOCAB, T, _load

dirs = tiny_transformers.dirs  # the saved models, a fixture of this file's own
N = 3
MODELS = [("bloom", {}), ("mpt", {}), ("falcon", {}), ("t5", {"part": "encoder"}), ("t5", {"part": "decoder"}),
          ("gpt2", {})]  # fmt: skip


def _summarise(adapter: Any, ids: np.ndarray, out: Path, batch: int, streamed: bool) -> tuple[bool, list[str]]:
    """The summary at ``out``; whether it was streamed (the route taken), and what it said."""
    import biasviz.extraction.summary as summary

    went = []
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        if streamed:
            patch.setattr(summary, "forms_rows_again", lambda adapter: False)
        inner = summary._streamed
        patch.setattr(summary, "_streamed", lambda *a, **k: went.append(1) or inner(*a, **k))
        extract_summary(adapter, ids, out, layers="all", batch_size=batch, resolution=T, progress=False)
    return bool(went), [str(w.message) for w in said]


def _read(path: Path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        for layer in (k for k in f if k.startswith("layer_")):
            out |= {f"{layer}/{key}": f[layer][key][()] for key in f[layer] if isinstance(f[layer][key], h5py.Dataset)}
    return out


def _library_weights(adapter: Any, ids: np.ndarray) -> list[np.ndarray]:
    """Per layer, (N, H, T, T) float64: the library's own ``output_attentions`` of the summarised self-attention."""
    model = adapter.model
    x = torch.from_numpy(ids)
    with torch.no_grad():
        if getattr(adapter, "part", None) == "decoder":
            got = model(input_ids=x, decoder_input_ids=x, output_attentions=True, use_cache=False).decoder_attentions
        else:
            got = model(**adapter.model_inputs(x), output_attentions=True).attentions
    return [w.double().numpy() for w in got]


@pytest.fixture(scope="module", params=[(name, opts, batch) for name, opts in MODELS for batch in (1, N)],
                ids=lambda p: f"{p[0]}{'-' + p[1]['part'] if p[1] else ''}, batch {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, dirs: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # fmt: skip
    name, opts, batch = request.param
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(3)).numpy()
    tmp = tmp_path_factory.mktemp("again")
    adapter = _load(dirs, name, **opts)
    went, said = _summarise(adapter, ids, tmp / "again.h5", batch, streamed=False)
    _summarise(_load(dirs, name, **opts), ids, tmp / "streamed.h5", batch, streamed=True)
    return {"streamed_route": went, "said": said, "again": _read(tmp / "again.h5"),
            "streamed": _read(tmp / "streamed.h5"), "library": _library_weights(adapter, ids), "adapter": adapter}


def test_the_rows_are_formed_again_not_streamed_and_nothing_is_said(summarised: dict[str, Any]) -> None:
    assert summarised["adapter"].replays
    assert not summarised["streamed_route"]
    assert not [s for s in summarised["said"] if "started again" in s]


def test_formed_again_as_the_rows_streamed_whole_give_it(summarised: dict[str, Any]) -> None:
    again, streamed = summarised["again"], summarised["streamed"]
    assert sorted(again) == sorted(streamed)
    for key, want in streamed.items():
        got = again[key]
        assert got.shape == want.shape and got.dtype == want.dtype, key
        for field in want.dtype.names or [None]:  # a table's columns one by one
            a, b = (got, want) if field is None else (got[field], want[field])
            if b.dtype.kind != "f":
                assert np.array_equal(a, b), key
                continue
            assert np.array_equal(np.isnan(a), np.isnan(b)), (key, field)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6, equal_nan=True, err_msg=f"{key} {field}")


def test_the_weights_mean_and_spread_are_the_library_s_own(summarised: dict[str, Any]) -> None:
    """weights_mean and weights_std over the attended cells against float64 numpy of output_attentions."""
    causal = summarised["adapter"].causal
    cells = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    for layer, w in enumerate(summarised["library"]):
        mean, std = w.mean(0), w.std(0)  # over samples, n in the denominator (docs/hdf5.md)
        mean, std = (np.where(cells, m, np.nan) for m in (mean, std))
        got = summarised["again"]
        np.testing.assert_allclose(got[f"layer_{layer}/weights_mean"], mean, atol=2e-6, equal_nan=True)
        np.testing.assert_allclose(got[f"layer_{layer}/weights_std"], std, atol=2e-6, equal_nan=True)
