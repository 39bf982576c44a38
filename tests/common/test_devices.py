"""Where and in what precision a model runs: extraction borrows the model and gives it back unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.devices import placed, resolve_dtype
from biasviz.common.errors import BiasvizError
from biasviz.extraction.run import extract
from biasviz.store import open_bias_file
from tests.conftest import small_model

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("device", DEVICES)
def test_placed_converts_inside_and_restores_bit_for_bit(device: str) -> None:
    model = small_model("t5").train()
    before = snapshot(model)
    params = list(model.parameters())
    with placed(model, torch.device(device), torch.bfloat16):
        assert all(p.device.type == device for p in model.parameters())
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert model.lm_head.weight is model.embed.weight  # tied weights stay tied
    assert list(model.parameters()) == params  # the same Parameter objects (optimisers, hooks keep working)
    after = model.state_dict()
    for k, v in before.items():
        assert after[k].device.type == "cpu" and after[k].dtype == v.dtype
        assert torch.equal(after[k], v), k


def test_placed_restores_after_an_error() -> None:
    model = small_model("alibi")
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="boom"), placed(model, torch.device("cpu"), torch.float16):
        raise RuntimeError("boom")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_resolve_dtype() -> None:
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(None) is None
    with pytest.raises(BiasvizError, match="float32, bfloat16, float16"):
        resolve_dtype("int8")


@pytest.mark.parametrize("device", DEVICES)
def test_extract_in_bfloat16_is_close_to_float32_and_leaves_the_model_alone(device: str, tmp_path) -> None:
    model = small_model("kerple-log")
    adapter = BiasGPTAdapter(model, source="t")
    model.train()  # extraction runs in eval mode and hands the model back in the mode it found
    before = snapshot(model)
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 24))
    full = extract(adapter, ids, tmp_path / "f.h5", device=device)
    half = extract(adapter, ids, tmp_path / "h.h5", device=device, model_dtype="bfloat16")
    assert model.training and all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    with open_bias_file(full.path) as a, open_bias_file(half.path) as b:
        assert a.attrs["model_dtype"] == "float32" and b.attrs["model_dtype"] == "bfloat16"
        assert b.dataset("weights").dtype == np.float32  # stored as --dtype, whatever the model ran in
        wa, wb = a.read("weights"), b.read("weights")
        np.testing.assert_allclose(wb, wa, atol=2e-2)  # bfloat16 keeps 8 bits of mantissa
        np.testing.assert_allclose(wb.sum(-1), 1.0, atol=1e-5)  # still a softmax formed in float32
        assert not np.array_equal(wa, wb)  # the precision did change
        np.testing.assert_allclose(b.read("bias"), a.read("bias"), rtol=1e-2, atol=1e-2)
