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


def sdpa_operands(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """q and k of every SDPA call of one forward, in order, as the model made them (float64)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def caught(q, k, *args, **kwargs):  # noqa: ANN001, ANN202
        seen.append((q.double(), k.double()))
        return original(q, k, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = caught
    try:
        with torch.no_grad():
            model(ids)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    return seen


def test_a_rotary_falcon_keeps_its_frequency_use(tmp_path: Path) -> None:
    model = _falcon(alibi=False)
    ids = torch.randint(1, 64, (N, T), generator=torch.Generator().manual_seed(2))
    seen = [q for q, _ in sdpa_operands(model, ids)]
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


def _gemma3() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                              sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                              attn_implementation="sdpa")  # fmt: skip
    return Gemma3ForCausalLM(config).eval()


def test_gemma3s_local_and_global_layers_keep_their_frequency_use(tmp_path: Path) -> None:
    """Gemma-3 holds one rotary module with a base per kind of layer (no ``inv_freq`` of its own) and pads with id 0,
    whose embedding is zero: both read, each layer's pairs measured against float64 norms of its own q and k."""
    model = _gemma3()
    ids = torch.randint(1, 64, (N, T), generator=torch.Generator().manual_seed(4))
    calls = sdpa_operands(model, ids)
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False, layers="all")
    with h5py.File(out, "r") as f:
        for layer, (q, k) in enumerate(calls):
            group = f[f"layer_{layer}"]
            assert group["frequency_use"].attrs["rotary_layout"] == "half-split" and "note" not in group.attrs
            for operand, x in enumerate((q.numpy(), k.numpy())):  # (N, H or H_kv, T, 8): pairs f, f + 4
                x = np.repeat(x, q.shape[1] // x.shape[1], axis=1)  # a key head for each query head it serves
                want = np.sqrt(x[..., :4] ** 2 + x[..., 4:] ** 2).mean((0, 2))
                got = group["frequency_use"][operand][:, :4]
                np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"layer {layer}, operand {operand}")


def test_a_rotary_module_it_cannot_read_leaves_a_note_naming_it(tmp_path: Path) -> None:
    """A rotary module whose frequencies biasviz cannot find (here: Gemma-3's, its bases renamed) gives no rotary
    measure, and each layer's note names the module."""
    model = _gemma3()
    rotary = model.model.rotary_emb
    for name, buffer in list(rotary.named_buffers(recurse=False)):
        delattr(rotary, name)
        rotary.register_buffer(name.replace("inv_freq", "frequencies"), buffer, persistent=False)
    rotary.forward = lambda x, position_ids, layer_type=None: _rotate(rotary, x, position_ids, layer_type)
    ids = np.random.default_rng(3).integers(1, 64, size=(N, T))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False, layers="all")
    with h5py.File(out, "r") as f:
        for layer in (0, 1):
            group = f[f"layer_{layer}"]
            assert "frequency_use" not in group and "positional_frequency" not in group
            assert "Gemma3RotaryEmbedding" in group.attrs["note"] and "does not read" in group.attrs["note"]


def _rotate(rotary: torch.nn.Module, x: torch.Tensor, position_ids: torch.Tensor,
            layer_type: str | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Gemma-3's cos and sin from the renamed bases."""
    freq = getattr(rotary, f"{layer_type}_frequencies")
    angles = position_ids[:, :, None].float() * freq[None, None, :].float()
    emb = torch.cat([angles, angles], -1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
