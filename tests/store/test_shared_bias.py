"""A bias declared the same for every input is measured, not assumed (every sample against the first).

A test model registered as context-free (ALiBi) whose scheme secretly adds a tiny input-dependent term is
caught: its bias is stored per sample, the file records the measured difference, and the context dependence
computed from the file is above 0 and equals numpy's on every sample's bias. Real context-free schemes record
a difference of exactly 0 and keep one stored bias.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.diagnostics.measures import diagnose_array
from biasviz.extraction.run import bias_is_shared, extract
from biasviz.store import open_bias_file
from biasviz.store.format import BIAS_DIFFERENCE
from tests.conftest import small_model

T = 24
SECRET = 1e-3


def _secretly_dependent(model: torch.nn.Module) -> torch.nn.Module:
    """Every layer's ALiBi plus SECRET times each query's mean input: still declared context-free."""
    for block in model.blocks:
        scheme = block.attn.pos_bias
        declared = scheme.rows

        def rows(x: torch.Tensor | None, declared=declared):  # noqa: ANN001, ANN202
            inner = declared(x)
            assert x is not None
            return lambda r0, r1: inner(r0, r1) + SECRET * x[:, r0:r1].mean(-1)[:, None, :, None]

        object.__setattr__(scheme, "rows", rows)
    return model


def _windows(n: int) -> np.ndarray:
    return np.random.default_rng(8).integers(0, 97, size=(n, T))


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_a_secretly_input_dependent_bias_is_stored_per_sample(tmp_path: Path, batch_size: int) -> None:
    adapter = BiasGPTAdapter(_secretly_dependent(small_model("alibi")), source="test")
    assert bias_is_shared(adapter)  # what the declaration says
    ids = _windows(5)
    extract(adapter, ids, tmp_path / "x.h5", layers="all", device="cpu", progress=False, batch_size=batch_size)
    with open_bias_file(tmp_path / "x.h5") as f:
        assert not f.bias_shared
        bias = f.read("bias", layer=1).astype(np.float64)  # (N, H, T, T)
        assert f.attrs[BIAS_DIFFERENCE] > 0
        lower = np.tril(np.ones((T, T), bool))
        gap = np.abs(bias - bias[:1])[..., lower].max()
        assert f.attrs[BIAS_DIFFERENCE] >= gap > 0  # the file's is over every layer
        measured = diagnose_array(bias)
    assert all(h.context_dependence is not None and h.context_dependence > 0 for h in measured)
    spread = bias[..., lower].std(0)  # numpy on every sample's bias: mean over cells of the std over samples
    scale = bias.mean(0)[..., lower].std(-1)
    np.testing.assert_allclose([h.context_dependence for h in measured], spread.mean(-1) / scale, rtol=1e-6)


@pytest.mark.parametrize("scheme", ["alibi", "kerple-log", "fire", "t5"])
def test_a_context_free_bias_is_measured_equal_and_stored_once(tmp_path: Path, scheme: str) -> None:
    ids = _windows(4)
    extract(BiasGPTAdapter(small_model(scheme), source="test"), ids, tmp_path / "x.h5", layers="all",
            device="cpu", progress=False, batch_size=3)  # fmt: skip
    with h5py.File(tmp_path / "x.h5") as f:
        assert f.attrs["bias_shared"] and f.attrs[BIAS_DIFFERENCE] == 0.0
        assert f["layer_0/bias"].shape[0] == 1


def test_a_context_dependent_scheme_records_no_comparison(tmp_path: Path) -> None:
    extract(BiasGPTAdapter(small_model("cable"), source="test"), _windows(3), tmp_path / "x.h5", device="cpu",
            progress=False)  # fmt: skip
    with h5py.File(tmp_path / "x.h5") as f:
        assert BIAS_DIFFERENCE not in f.attrs and "bias_shared" not in f.attrs


def test_a_call_that_turns_to_every_key_is_stored_so_from_the_next_batch(tmp_path: Path) -> None:
    """A weights-only file of two causal layers, layer 0's call turning to every key after sample 0: sample 0 holds 0
    after its queries, as the writer stored it; sample 1 every value given. The file's rule becomes every key, and the
    layer still causal says its own, as the reader reads them; a file that holds a bias refuses the switch once samples
    were written."""
    from biasviz.store import BiasFileWriter
    from tests.store.small_files import H, _attrs
    from tests.store.small_files import T as t

    rng = np.random.default_rng(1)
    weights = {layer: rng.random((2, H, t, t)).astype(np.float32) for layer in (0, 1)}
    above = np.triu(np.ones((t, t), dtype=bool), 1)
    args = {"attrs": _attrs(), "n_samples": 2, "n_heads": H, "seq_len": t, "layers": [0, 1], "has_bias": False}
    with BiasFileWriter(tmp_path / "f.h5", **args) as w:
        w.write_batch(np.zeros((1, t)), {layer: weights[layer][:1] for layer in (0, 1)})
        w.see_every_key([0], causal=False)
        w.write_batch(np.zeros((1, t)), {layer: weights[layer][1:] for layer in (0, 1)})
    with h5py.File(tmp_path / "f.h5") as f:
        assert not f.attrs["causal"] and "causal" not in f["layer_0"].attrs and f["layer_1"].attrs["causal"]
        np.testing.assert_array_equal(f["layer_0/weights"][0], np.where(above, 0.0, weights[0][0]))
        np.testing.assert_array_equal(f["layer_0/weights"][1], weights[0][1])
        np.testing.assert_array_equal(f["layer_1/weights"][...], np.where(above, 0.0, weights[1]))
    with open_bias_file(tmp_path / "f.h5") as f:
        assert not f.causal and (f.layer_causal(0), f.layer_causal(1)) == (False, True)
    with pytest.raises(AssertionError), BiasFileWriter(tmp_path / "b.h5", **{**args, "has_bias": True}) as w:
        w.write_batch(np.zeros((1, t)), {0: weights[0][:1], 1: weights[1][:1]},
                      {0: np.zeros((1, H, t, t), np.float32), 1: np.zeros((1, H, t, t), np.float32)})
        w.see_every_key([0], causal=False)
    assert not (tmp_path / "b.h5").exists()
