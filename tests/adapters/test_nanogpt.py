"""nanoGPT-style state dicts (:mod:`biasviz.adapters.nanogpt`): the architecture read off the tensors' shapes, the
keys renamed onto biasviz's GPT-2 variant, the scheme from the keys or ``--scheme``, and the model they rebuild
against one written here independently of biasviz (nanoGPT's attention, CABLE's reference, GPT-NeoX's rotation) and
against transformers' own GPT-2 (its Conv1D layout)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from biasviz.adapters import load_model
from biasviz.common.errors import BiasvizError
from biasviz.extraction.run import extract
from biasviz.store import open_bias_file
from tests.adapters.test_adapters import C, H, L, T, V, _assemble, _kinds, ids
from tests.extraction.test_run import windows


# --- a nanoGPT-shaped model, written here (independently of biasviz) ---------------------------------
class RefAttention(nn.Module):
    """nanoGPT's CausalSelfAttention, plus CABLE's h_attn when asked; unscaled like the CABLE reference."""

    def __init__(self, cable: bool, scaled: bool, rope: bool = False) -> None:
        super().__init__()
        self.rope = rope
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.h_attn = nn.Linear(C, H) if cable else None
        self.scaled = scaled
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.last: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, t, _ = x.shape
        q, k, v = (z.view(B, t, H, C // H).transpose(1, 2) for z in self.c_attn(x).split(C, dim=2))
        if self.rope:  # rotated by GPT-NeoX's own function, angles position · 10000^(-2f/d)
            from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

            d = C // H
            angles = torch.arange(t, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
            angles = torch.cat([angles, angles], dim=-1)
            q, k = apply_rotary_pos_emb(q, k, angles.cos().float()[None], angles.sin().float()[None])
        att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(C // H) if self.scaled else 1.0)
        if self.h_attn is not None:
            s = -torch.cumsum(F.softplus(self.h_attn(x)), dim=1).transpose(1, 2)  # (B, H, T)
            bias = s[:, :, :, None] - s[:, :, None, :]  # (B, H, T, T)
            self.last["bias"] = bias
            att = att + bias
        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        self.last["weights"] = att
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, t, C))


class RefBlock(nn.Module):
    def __init__(self, cable: bool, scaled: bool, rope: bool = False) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = RefAttention(cable, scaled, rope)
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(C, 4 * C), "c_proj": nn.Linear(4 * C, C)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp["c_proj"](F.gelu(self.mlp["c_fc"](self.ln_2(x))))  # nn.GELU(): exact erf


class RefGPT(nn.Module):
    def __init__(self, cable: bool = True, scaled: bool = False, wpe: bool = False, rope: bool = False) -> None:
        super().__init__()
        parts = {"wte": nn.Embedding(V, C), "h": nn.ModuleList(RefBlock(cable, scaled, rope) for _ in range(L))}
        if wpe:
            parts["wpe"] = nn.Embedding(T, C)
        parts["ln_f"] = nn.LayerNorm(C)
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT
        with torch.no_grad():
            for block in self.transformer.h:
                if block.attn.h_attn is not None:
                    block.attn.h_attn.weight.normal_(0, 0.5)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def ref_model(**kw: bool) -> RefGPT:
    torch.manual_seed(0)
    return RefGPT(**kw).eval()


# --- nanoGPT state dicts ---------------------------------------------------------------------------
def test_cable_reference_state_dict_reproduces_bias_and_weights(tmp_path):
    ref = ref_model(cable=True, scaled=False)
    torch.save(ref.state_dict(), tmp_path / "cable.pt")  # what the CABLE reference code writes
    adapter = load_model(tmp_path / "cable.pt", attn_scale=1.0)  # --no-scale
    assert (adapter.scheme, adapter.n_layers, adapter.n_heads, adapter.architecture) == ("cable", L, H, "nanogpt")
    x = ids()
    out = extract(adapter, x, tmp_path / "c.h5", layers="all", batch_size=2)
    with torch.no_grad():
        ref(torch.as_tensor(x))  # runs all 3 samples at once
    used = np.tril(np.ones((T, T), bool))
    with open_bias_file(out.path) as f:
        assert f.attrs["model_sha256"] and f.attrs["architecture"] == "nanogpt"
        assert json.loads(f.attrs["config_json"])["attn_scale"] == 1.0
        for layer in range(L):
            last = ref.transformer.h[layer].attn.last
            np.testing.assert_allclose(f.read("weights", layer), last["weights"].numpy(), atol=2e-6)
            np.testing.assert_allclose(f.read("bias", layer)[..., used], last["bias"].numpy()[..., used], atol=2e-5)


def test_scaled_default_differs_from_the_unscaled_reference_and_says_so(tmp_path):
    ref = ref_model(cable=True, scaled=False)
    torch.save(ref.state_dict(), tmp_path / "cable.pt")
    with pytest.warns(UserWarning, match="--no-scale"):
        adapter = load_model(tmp_path / "cable.pt")
    out = extract(adapter, ids(1), tmp_path / "c.h5")
    with torch.no_grad():
        ref(torch.as_tensor(ids(1)))
    with open_bias_file(out.path) as f:
        assert not np.allclose(f.read("weights"), ref.transformer.h[-1].attn.last["weights"].numpy(), atol=1e-3)


def test_nanogpt_ckpt_dict_with_compile_prefixes_and_model_args(tmp_path):
    ref = ref_model(cable=False, scaled=True, wpe=True)
    state = {f"_orig_mod.{k}": v for k, v in ref.state_dict().items()}
    ckpt = {"model": state, "model_args": {"n_layer": L, "n_head": H, "n_embd": C, "block_size": T},
            "iter_num": 10, "best_val_loss": torch.tensor(1.5), "config": {"dataset": "x"}}  # fmt: skip
    torch.save(ckpt, tmp_path / "ckpt.pt")
    adapter = load_model(tmp_path)  # nanoGPT's out_dir, holding ckpt.pt
    assert adapter.scheme == "learned" and adapter.n_heads == H and adapter.max_length == T
    out = extract(adapter, ids(2), tmp_path / "l.h5")
    with torch.no_grad():
        ref(torch.as_tensor(ids(2)))
    with open_bias_file(out.path) as f:
        assert not f.has_bias()
        np.testing.assert_allclose(f.read("weights"), ref.transformer.h[-1].attn.last["weights"].numpy(), atol=2e-6)


def test_scheme_needed_when_keys_do_not_tell(tmp_path):
    ref = ref_model(cable=False, scaled=True)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if k != "lm_head.weight"},
              tmp_path / "nope.safetensors")  # fmt: skip
    with pytest.raises(BiasvizError, match="pass --scheme"):
        load_model(tmp_path / "nope.safetensors")
    with pytest.raises(BiasvizError, match="not a multiple of 64"):  # width 48 and no model_args
        load_model(tmp_path / "nope.safetensors", "nope")
    torch.save({"model": ref.state_dict(), "model_args": {"n_head": H}}, tmp_path / "nope.pt")
    adapter = load_model(tmp_path / "nope.pt", "nope")
    out = extract(adapter, ids(1), tmp_path / "n.h5")
    with torch.no_grad():
        ref(torch.as_tensor(ids(1)))
    with open_bias_file(out.path) as f:
        np.testing.assert_allclose(f.read("weights"), ref.transformer.h[-1].attn.last["weights"].numpy(), atol=2e-6)
    adapter = load_model(tmp_path / "nope.pt", "alibi")  # ALiBi's fixed slopes need no stored tensor
    assert adapter.scheme == "alibi"
    with pytest.raises(BiasvizError, match="lacks weights.*pos_bias"):
        load_model(tmp_path / "nope.pt", "kerple")  # learned parameters that the file does not hold


def test_a_nanogpt_state_dict_with_rotary_positions_loads_as_rope(tmp_path):
    """No wpe and no h_attn: ``--scheme rope`` reads the same keys, and rotates as GPT-NeoX's own function does."""
    ref = ref_model(cable=False, scaled=True, rope=True)
    torch.save({"model": ref.state_dict(), "model_args": {"n_head": H}}, tmp_path / "rope.pt")
    adapter = load_model(tmp_path / "rope.pt", "rope")
    assert adapter.scheme == "rope" and adapter.n_heads == H
    out = extract(adapter, ids(2), tmp_path / "r.h5", layers="all")
    with torch.no_grad():
        ref(torch.as_tensor(ids(2)))
    with open_bias_file(out.path) as f:
        assert not f.has_bias()
        for layer in range(L):
            np.testing.assert_allclose(f.read("weights", layer), ref.transformer.h[layer].attn.last["weights"].numpy(),
                                       atol=2e-6)  # fmt: skip


def test_head_count_assumed_from_64_wide_heads_with_a_warning(tmp_path):
    state = {"transformer.wte.weight": torch.randn(V, 128)}
    for n in ("ln_1", "ln_2"):  # bias=False, as nanoGPT allows: no biases in linears or layer norms
        state[f"transformer.h.0.{n}.weight"] = torch.ones(128)
    state |= {
        "transformer.h.0.attn.c_attn.weight": torch.randn(384, 128),
        "transformer.h.0.attn.c_proj.weight": torch.randn(128, 128),
        "transformer.h.0.mlp.c_fc.weight": torch.randn(512, 128),
        "transformer.h.0.mlp.c_proj.weight": torch.randn(128, 512),
        "transformer.ln_f.weight": torch.ones(128),
    }
    torch.save(state, tmp_path / "w.pt")
    with pytest.warns(UserWarning, match="assuming 64 dimensions per head"):
        adapter = load_model(tmp_path / "w.pt", "nope")
    assert adapter.n_heads == 2 and adapter.model.config.bias is False


def test_contradictions_and_strange_keys_are_errors(tmp_path):
    ref = ref_model(cable=True)
    torch.save(ref.state_dict(), tmp_path / "c.pt")
    with pytest.raises(BiasvizError, match="contradicts"):
        load_model(tmp_path / "c.pt", "alibi")
    torch.save({**ref.state_dict(), "transformer.h.0.attn.rotary.freq": torch.ones(4)}, tmp_path / "x.pt")
    with pytest.raises(BiasvizError, match="does not know where to put.*rotary"):
        load_model(tmp_path / "x.pt", attn_scale=1.0)
    torch.save({"optimizer": {"lr": 1.0}}, tmp_path / "o.pt")
    with pytest.raises(BiasvizError, match="no tensors"):
        load_model(tmp_path / "o.pt")
    (tmp_path / "broken.pt").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(BiasvizError, match="not a readable PyTorch checkpoint"):
        load_model(tmp_path / "broken.pt")


# --- transformers' GPT-2 state dicts (Conv1D weights) -----------------------------------------------
def test_weights_equal_transformers_eager_gpt2(tmp_path):
    """Vanilla GPT-2 weights (transformers' Conv1D layout) reproduce transformers' eager attention."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=H, n_embd=C, vocab_size=97, n_positions=64, attn_implementation="eager")
    hf = GPT2LMHeadModel(cfg).eval()
    torch.save({"model": hf.state_dict(), "model_args": {"n_head": H}}, tmp_path / "gpt2.pt")  # width 48: say H
    adapter = load_model(tmp_path / "gpt2.pt")
    assert adapter.scheme == "learned" and adapter.architecture == "gpt2-state-dict"
    ids = windows(2, 32)
    result = extract(adapter, ids, tmp_path / "g.h5", layers="all")
    with torch.no_grad():
        attentions = hf(torch.as_tensor(ids), output_attentions=True).attentions
    with open_bias_file(result.path) as f:
        for layer in (0, 1):
            np.testing.assert_allclose(f.read("weights", layer), attentions[layer].numpy(), atol=1e-6)


# --- streaming blocks of query rows ---------------------------------------------------------------------------
def test_nanogpt_stream_reproduces_the_reference_in_blocks(tmp_path, monkeypatch):
    from biasviz.model.modeling import Attention

    ref = ref_model(cable=True, scaled=False)
    torch.save(ref.state_dict(), tmp_path / "cable.pt")
    adapter = load_model(tmp_path / "cable.pt", attn_scale=1.0)
    monkeypatch.setattr(Attention, "block_elements", 36 * 50)
    x = torch.as_tensor(ids(3))
    sent: list[tuple[int, str, int, torch.Tensor]] = []
    with adapter.stream([0, 1], True, lambda b: sent.extend(_kinds(b))):
        adapter.forward(x)
    with torch.no_grad():
        ref(x)
    assert len({row0 for *_, row0, _ in sent}) > 3
    got = _assemble(sent, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in range(L):
        last = ref.transformer.h[layer].attn.last
        torch.testing.assert_close(got[layer, "weights"], last["weights"], rtol=0, atol=2e-6)
        torch.testing.assert_close(got[layer, "bias"][..., causal], last["bias"][..., causal], rtol=0, atol=2e-5)
