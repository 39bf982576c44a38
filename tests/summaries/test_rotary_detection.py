"""Whether a call rotates is read from what it does, not from what the model holds (docs/position-measures.md): Falcon
with ALiBi builds a rotary module it never applies, and its summary stores no rotary measure and says why; the same
family with rotary embeddings keeps them, its layout's pairs measured against float64 norms of its own q and k."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz

T, N = 16, 3


def _falcon(alibi: bool) -> torch.nn.Module:
    from transformers import FalconConfig, FalconForCausalLM

    torch.manual_seed(0)
    config = FalconConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64, alibi=alibi,
                          new_decoder_architecture=False, multi_query=False, bias=False)  # fmt: skip
    return FalconForCausalLM(config).eval()


@pytest.mark.parametrize("given", ["module", "directory"])
def test_a_model_that_rotates_nothing_stores_no_rotary_measure_and_says_why(tmp_path: Path, given: str) -> None:
    model = _falcon(alibi=True)
    assert any("rotary" in type(m).__name__.lower() for m in model.modules())  # it holds one
    source: torch.nn.Module | str = model
    if given == "directory":
        model.save_pretrained(tmp_path / "falcon")
        source = str(tmp_path / "falcon")
    ids = np.random.default_rng(1).integers(1, 64, size=(N, T))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(source, ids, out, summary=True, progress=False, layers="all")
    with h5py.File(out, "r") as f:
        for layer in (0, 1):
            group = f[f"layer_{layer}"]
            assert not {"frequency_use", "frequency_use_se", "positional_frequency"} & set(group)
            assert "rotates nothing" in group.attrs["note"]
            assert "positional_mean" in group  # P itself is stored


def test_a_rotary_falcon_keeps_its_frequency_use(tmp_path: Path) -> None:
    model = _falcon(alibi=False)
    ids = torch.randint(1, 64, (N, T), generator=torch.Generator().manual_seed(2))
    seen: list[torch.Tensor] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def caught(q, k, *args, **kwargs):  # noqa: ANN001, ANN202
        seen.append(q.double())
        return original(q, k, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = caught
    try:
        with torch.no_grad():
            model(ids)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False, layers=[0])
    q = seen[0].numpy()  # (N, H, T, 8): half-split pairs f, f + 4
    want = np.sqrt(q[..., :4] ** 2 + q[..., 4:] ** 2).mean((0, 2))  # (H, 4)
    with h5py.File(out, "r") as f:
        group = f["layer_0"]
        assert group["frequency_use"].attrs["rotary_layout"] == "half-split"
        np.testing.assert_allclose(group["frequency_use"][0], want, rtol=1e-5)
        assert "rotates nothing" not in str(group.attrs.get("note", ""))
