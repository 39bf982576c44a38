"""Tracing fused attention (SDPA, flex_attention) in any model: weights and biases against each library's
own explicit attention, and against attention written out here in float64."""

from __future__ import annotations

import math
import warnings

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import biasviz
from biasviz.common.errors import BiasvizError
from tests import nano_gpt
from tests.conftest import run_cli

TOL = 1e-5


def press_slopes(n: int) -> torch.Tensor:
    """Press et al.'s ALiBi slopes for a power-of-two head count: 2^(-8h/n), h = 1..n."""
    return torch.tensor([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)], dtype=torch.float64)


def reference(q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None,
              kept: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """Post-softmax weights in float64: softmax over the kept keys of q.k * scale + bias."""
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias.double()
    return torch.softmax(s.masked_fill(~kept, float("-inf")), dim=-1).nan_to_num(0.0)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a.double() - b.double()).abs() <= TOL).all())


def causal_kept(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


def alibi(heads: int, t: int) -> torch.Tensor:
    i = torch.arange(t, dtype=torch.float64)
    return -press_slopes(heads)[:, None, None] * (i[:, None] - i[None, :])  # (H, T, T)


# --- SDPA: every way a call can mask and scale --------------------------------------------------------------
B, H, T, E = 2, 4, 24, 16


def _qkv(heads_kv: int = H, dims: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, T, E, generator=g)
    k, v = torch.randn(B, heads_kv, T, E, generator=g), torch.randn(B, heads_kv, T, E, generator=g)
    if dims == 3:
        return q[:, 0], k[:, 0], v[:, 0]
    return q, k, v


def _float_mask(fill: float) -> torch.Tensor:
    return alibi(H, T).float().masked_fill(~causal_kept(T), fill)[None]  # (1, H, T, T)


PADDED = torch.stack([causal_kept(T), causal_kept(T) & (torch.arange(T) >= 3)])[:, None]  # sample 2: 3 pads
SDPA_CASES = {
    "is_causal": ({"is_causal": True}, None, causal_kept(T)),
    "bool mask": ({"attn_mask": causal_kept(T)}, None, causal_kept(T)),
    "float mask -inf": ({"attn_mask": _float_mask(float("-inf"))}, alibi(H, T), causal_kept(T)),
    "float mask finfo.min": ({"attn_mask": _float_mask(torch.finfo(torch.float32).min)}, alibi(H, T), causal_kept(T)),
    "x-transformers -max/2": ({"attn_mask": _float_mask(-torch.finfo(torch.float32).max // 2)}, alibi(H, T),
                              causal_kept(T)),
    "float mask -1e9": ({"attn_mask": _float_mask(-1e9)}, alibi(H, T), causal_kept(T)),
    "bidirectional bias": ({"attn_mask": alibi(H, T).abs().neg().float()}, alibi(H, T).abs().neg(),
                           torch.ones(T, T, dtype=torch.bool)),
    "explicit scale": ({"is_causal": True, "scale": 0.05}, None, causal_kept(T)),
    "padding, batch-wise": ({"attn_mask": PADDED}, None, PADDED),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_sdpa_call_weights_and_bias(case: str) -> None:
    kwargs, bias, kept = SDPA_CASES[case]
    q, k, v = _qkv()
    with biasviz.trace() as t:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, **kwargs))  # the call itself is untouched
    scale = kwargs.get("scale", 1 / math.sqrt(E))
    assert close(t.weights[0], reference(q, k, scale, bias, kept))
    if bias is None:
        assert 0 not in t.bias
        return
    got = t.bias[0].double()
    kept4 = kept.expand_as(got)
    assert torch.isnan(got[~kept4]).all()
    assert close(got[kept4], bias.expand_as(got)[kept4])


def test_sdpa_grouped_query_heads_and_three_dim_inputs() -> None:
    q, k, v = _qkv(heads_kv=2)
    with biasviz.trace() as t:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        F.scaled_dot_product_attention(*_qkv(dims=3), is_causal=True)
    k_rep = k.repeat_interleave(2, dim=1)  # query head h reads key head h // 2
    assert close(t.weights[0], reference(q, k_rep, 1 / math.sqrt(E), None, causal_kept(T)))
    q3, k3, _ = _qkv(dims=3)
    assert t.weights[1].shape == (B, 1, T, T)
    assert close(t.weights[1][:, 0], reference(q3, k3, 1 / math.sqrt(E), None, causal_kept(T)))


def test_a_float_mask_of_zeros_is_a_mask_not_a_bias() -> None:
    q, k, v = _qkv()
    mask = torch.zeros(T, T).masked_fill(~causal_kept(T), torch.finfo(torch.float32).min)
    with biasviz.trace() as t:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert t.bias == {} and t.calls[0].causal and not t.calls[0].adds_bias


# --- nanoGPT's model.py call pattern --------------------------------------------------------------------------
def test_nanogpt_flash_path_equals_its_explicit_path() -> None:
    fused, explicit = nano_gpt.pair()
    idx = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), biasviz.trace(fused) as t:
        logits = fused(idx)
    with torch.no_grad():
        assert torch.allclose(logits, explicit(idx), atol=1e-4)
    assert len(t.calls) == 3 and t.bias == {}
    for layer, block in enumerate(explicit.transformer.h):
        assert close(t.weights[layer], block.attn.last_att)


# --- x-transformers: ALiBi through flash (SDPA with a float mask) against its own explicit attention ----------
def test_x_transformers_alibi_flash_against_explicit_and_press_slopes() -> None:
    xt = pytest.importorskip("x_transformers")
    heads, t_len = 4, 48

    def build(flash: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        layers = xt.Decoder(dim=64, depth=2, heads=heads, alibi_pos_bias=True, attn_flash=flash)
        return xt.TransformerWrapper(num_tokens=100, max_seq_len=t_len, attn_layers=layers).eval()

    fused, explicit = build(True), build(False)
    explicit.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 100, (2, t_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), biasviz.trace(fused) as t:
        fused(idx)
    with torch.no_grad():
        _, maps = explicit(idx, return_attn=True)  # post-softmax attention of each layer
    assert len(t.calls) == len(maps) == 2
    kept = causal_kept(t_len)
    for layer in range(2):
        assert close(t.weights[layer], maps[layer])
        bias = t.bias[layer]  # (B, H, T, T)
        assert torch.isnan(bias[..., ~kept]).all()
        assert close(bias[..., kept], alibi(heads, t_len)[:, kept].expand(2, -1, -1))


# --- transformers GPT-2 with SDPA against eager output_attentions ---------------------------------------------
def test_transformers_gpt2_sdpa_against_eager_output_attentions(tmp_path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    def config() -> GPT2Config:  # one each: a model keeps (and sets) its config's attention implementation
        return GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=100, n_positions=64, bos_token_id=0,
                          eos_token_id=0)  # fmt: skip

    torch.manual_seed(0)
    sdpa = GPT2LMHeadModel._from_config(config(), attn_implementation="sdpa").eval()
    eager = GPT2LMHeadModel._from_config(config(), attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = eager(idx, output_attentions=True).attentions
    result = biasviz.extract(sdpa, idx, tmp_path / "gpt2.h5", layers="all", device="cpu", progress=False)
    assert result.layers == [0, 1] and not result.has_bias
    with h5py.File(tmp_path / "gpt2.h5") as f:
        assert f.attrs["architecture"] == "GPT2LMHeadModel" and f.attrs["scheme"] == "captured"
        assert list(f.attrs["layers"]) == [0, 1] and np.array_equal(f["input_ids"][:], idx.numpy())
        for layer in range(2):
            assert close(torch.from_numpy(f[f"layer_{layer}/weights"][:]), expected[layer])


def test_a_transformers_architecture_without_an_adapter_loads_with_sdpa(tmp_path) -> None:
    """Llama (grouped-query heads, rotary positions): --model on its directory traces SDPA, with no adapter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    eager = LlamaForCausalLM.from_pretrained(tmp_path / "llama", attn_implementation="eager").eval()
    idx = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = eager(idx, output_attentions=True).attentions
    biasviz.extract(str(tmp_path / "llama"), idx, tmp_path / "llama.h5", layers="all", device="cpu", progress=False)
    with h5py.File(tmp_path / "llama.h5") as f:
        assert f.attrs["architecture"] == "LlamaForCausalLM" and "layer_0/bias" not in f
        for layer in range(2):
            assert close(torch.from_numpy(f[f"layer_{layer}/weights"][:]), expected[layer])


# --- flex_attention: an ALiBi score_mod and a causal block mask -----------------------------------------------
def _flex(score_mod, t_len: int = 32, heads: int = 4, kv_heads: int = 4):  # noqa: ANN001, ANN202
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, heads, t_len, E, generator=g)
    k, v = torch.randn(2, kv_heads, t_len, E, generator=g), torch.randn(2, kv_heads, t_len, E, generator=g)
    block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, t_len, t_len, device="cpu")
    with warnings.catch_warnings(), biasviz.trace() as t:
        warnings.simplefilter("ignore")  # flex_attention's note that it runs unfused without torch.compile
        flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=kv_heads != heads)
    return t, q, k


def test_flex_attention_alibi_score_mod_and_causal_block_mask() -> None:
    slopes = press_slopes(4).float()

    def alibi_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return score - slopes[h] * (q_idx - kv_idx)

    t, q, k = _flex(alibi_mod)
    kept = causal_kept(32)
    assert t.calls[0].kind == "flex_attention" and t.calls[0].causal
    assert close(t.weights[0], reference(q, k, 1 / math.sqrt(E), alibi(4, 32), kept))
    assert torch.isnan(t.bias[0][..., ~kept]).all()
    assert close(t.bias[0][..., kept], alibi(4, 32)[:, kept].expand(2, -1, -1))


def test_flex_attention_grouped_query_heads() -> None:
    t, q, k = _flex(None, kv_heads=2)
    assert close(t.weights[0], reference(q, k.repeat_interleave(2, dim=1), 1 / math.sqrt(E), None, causal_kept(32)))
    assert t.bias == {}


def test_flex_softcapping_is_reported_not_recorded_as_a_bias() -> None:
    def softcap(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return 2.0 * torch.tanh(score / 2.0)

    t, q, k = _flex(softcap)
    assert t.bias == {} and "not additive" in t.notes[0]
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(E)
    expected = torch.softmax((2 * torch.tanh(s / 2)).masked_fill(~causal_kept(32), float("-inf")), dim=-1)
    assert close(t.weights[0], expected)


# --- biasviz.extract and the CLI on the user's own code --------------------------------------------------------
def test_extract_a_module_streams_only_the_requested_calls(tmp_path) -> None:
    fused, explicit = nano_gpt.pair()
    idx = torch.randint(0, 101, (3, 40), generator=torch.Generator().manual_seed(3))
    result = biasviz.extract(fused, idx, tmp_path / "nano.h5", layers=[0, 2], batch_size=2, device="cpu",
                             progress=False)  # fmt: skip
    assert result.layers == [0, 2]
    with torch.no_grad():
        explicit(idx)
    with h5py.File(tmp_path / "nano.h5") as f:
        assert f.attrs["n_layers"] == 3 and f.attrs["architecture"] == "GPT" and "layer_1" not in f
        for layer in (0, 2):
            assert close(torch.from_numpy(f[f"layer_{layer}/weights"][:]), explicit.transformer.h[layer].attn.last_att)
    with pytest.raises(BiasvizError, match="already exists"):
        biasviz.extract(fused, idx, tmp_path / "nano.h5")
    with pytest.raises(BiasvizError, match="makes 3 attention calls"):
        biasviz.extract(fused, idx, tmp_path / "other.h5", layers=5, device="cpu")


def test_extract_refuses_a_model_that_calls_no_fused_attention(tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10))
    with pytest.raises(BiasvizError, match="without calling scaled_dot_product_attention"):
        biasviz.extract(model, torch.zeros(1, 5, dtype=torch.long), tmp_path / "x.h5", device="cpu")
    assert not (tmp_path / "x.h5").exists()


def test_cli_checkpoint_applies_to_code_only(tmp_path, capsys) -> None:
    rc, _, err = run_cli(["extract", "--model", str(tmp_path), "--checkpoint", "x.pt"], capsys)
    assert rc == 2 and "--checkpoint applies to --model CODE.py:FACTORY" in err


def test_plot_draws_a_captured_file_under_its_recorded_name(tmp_path, capsys) -> None:
    fused, _ = nano_gpt.pair()
    model = torch.nn.Sequential(torch.nn.Embedding(101, 64), fused.transformer.h[0].attn)  # one SDPA call
    biasviz.extract(model, torch.randint(0, 101, (1, 24)), tmp_path / "c.h5", device="cpu", progress=False)
    rc, out, err = run_cli(["plot", "--scheme", "captured", "--input", str(tmp_path / "c.h5"), "--kind", "weights",
                            "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert rc == 0, err
    assert (tmp_path / "captured_weights.png").stat().st_size > 0
    rc, _, err = run_cli(["plot", "--scheme", "nonesuch", "--out-dir", str(tmp_path)], capsys)
    assert rc == 1 and "unknown scheme 'nonesuch'" in err


def test_extracting_a_softcapped_flex_model_warns_and_stores_no_bias(tmp_path, capsys) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    class Softcapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.qkv = torch.nn.Embedding(50, 32), torch.nn.Linear(32, 96)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            q, k, v = (z.view(*ids.shape, 2, 16).transpose(1, 2) for z in self.qkv(self.emb(ids)).split(32, dim=-1))
            return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 5.0 * torch.tanh(s / 5.0))

    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = biasviz.extract(Softcapped(), torch.randint(0, 50, (2, 16)), tmp_path / "s.h5", device="cpu",
                                 progress=False)  # fmt: skip
    assert not result.has_bias
    assert any("attention call 0: score_mod is not additive" in str(w.message) for w in caught)
    with h5py.File(tmp_path / "s.h5") as f:
        assert "layer_0/bias" not in f and f["layer_0/weights"].shape == (2, 2, 16, 16)


@pytest.mark.cuda
def test_trace_on_the_gpu_equals_the_explicit_path() -> None:
    fused, explicit = (m.cuda() for m in nano_gpt.pair())
    idx = torch.randint(0, 101, (2, 64), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad(), biasviz.trace(fused) as t:
        fused(idx)
    with torch.no_grad():
        explicit(idx)
    for layer, block in enumerate(explicit.transformer.h):
        assert t.weights[layer].is_cuda and close(t.weights[layer].cpu(), block.attn.last_att.cpu())


def test_a_model_that_refuses_a_short_probe_is_probed_at_full_length(tmp_path) -> None:
    """flex_attention with a BlockMask built for one length refuses any other: the probe falls back."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    t_len = 96  # longer than the short probe

    class FixedLength(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.qkv = torch.nn.Embedding(50, 32), torch.nn.Linear(32, 96)
            self.mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, t_len, t_len, device="cpu")

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            q, k, v = (z.view(*ids.shape, 2, 16).transpose(1, 2) for z in self.qkv(self.emb(ids)).split(32, dim=-1))
            return flex_attention(q, k, v, block_mask=self.mask)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = biasviz.extract(FixedLength(), torch.randint(0, 50, (1, t_len)), tmp_path / "f.h5", device="cpu",
                                 progress=False)  # fmt: skip
    assert result.seq_len == t_len and not result.has_bias


def test_a_captured_file_does_not_claim_to_know_its_context_dependence(tmp_path, capsys) -> None:
    fused, _ = nano_gpt.pair()
    biasviz.extract(fused, torch.randint(0, 101, (1, 16)), tmp_path / "c.h5", device="cpu", progress=False)
    with h5py.File(tmp_path / "c.h5") as f:
        assert not f.attrs["context_dependent_known"]
    rc, out, _ = run_cli(["info", str(tmp_path / "c.h5")], capsys)
    assert rc == 0 and "context dependence not recorded" in out and "context-independent" not in out


@pytest.mark.parametrize("variant", ["causal_lower_right", "causal_upper_left"])
def test_torch_causal_bias_masks_are_read_as_the_cells_they_stand_for(variant: str) -> None:
    """torch's CausalBias is a tensor subclass standing for a mask (aligned at the lower right or the upper left when
    queries and keys differ in number): the weights are a softmax over the cells torch's own materialisation keeps."""
    from torch.nn.attention import bias as torch_bias

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, 4, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    mask = getattr(torch_bias, variant)(4, 6)
    with biasviz.trace() as t:
        torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)
    kept = mask._materialize(q.device)
    expected = torch.softmax((q.double() @ k.double().transpose(-1, -2) / 8**0.5).masked_fill(~kept, -torch.inf), -1)
    torch.testing.assert_close(t.weights[0].double(), expected, atol=1e-6, rtol=0)
    assert type(t.weights[0]) is torch.Tensor
