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
from biasviz.adapters.nanogpt import NanoGPTAdapter, load_state_dict_model, read_layout, unwrap
from biasviz.common.errors import BiasvizError
from biasviz.extraction.full_matrices import full_matrices
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


# --- what the keys and shapes say -------------------------------------------------------------------------------
def _keys(c: int = 4, layers: int = 2, vocab: int = 11) -> dict[str, torch.Tensor]:
    """The tensors read_layout reads the architecture from, nanoGPT's way round (c_attn (3C, C))."""
    g = torch.Generator().manual_seed(0)
    state = {"transformer.wte.weight": torch.randn(vocab, c, generator=g)}
    for n in range(layers):
        state[f"transformer.h.{n}.attn.c_attn.weight"] = torch.randn(3 * c, c, generator=g)
        state[f"transformer.h.{n}.attn.c_attn.bias"] = torch.randn(3 * c, generator=g)
        state[f"transformer.h.{n}.attn.bias"] = torch.ones(1, 1, 16, 16).tril()  # nanoGPT's causal mask buffer
    return state


def test_a_checkpoint_is_unwrapped_to_its_tensors_and_model_arguments(tmp_path) -> None:
    wte = torch.zeros(3, 2)
    tensors, args = unwrap({"state_dict": {"transformer.wte.weight": wte}, "config": {"n_head": 2, "block_size": 8},
                            "model_args": {"n_head": 4}, "step": 10}, tmp_path / "x.pt")  # fmt: skip
    assert list(tensors) == ["transformer.wte.weight"] and tensors["transformer.wte.weight"] is wte
    assert args == {"n_head": 4, "block_size": 8}  # model_args say it over config
    tensors, args = unwrap({"model_state_dict": {"transformer.wte.weight": wte}}, tmp_path / "x.pt")
    assert list(tensors) == ["transformer.wte.weight"] and args == {}
    tensors, _ = unwrap({"transformer.wte.weight": wte, "iter_num": 3, "lr": 0.1}, tmp_path / "x.pt")  # flat
    assert list(tensors) == ["transformer.wte.weight"]  # its tensors only
    with pytest.raises(BiasvizError, match=r"x\.pt holds a list, not a state dict of tensors"):
        unwrap([torch.zeros(1)], tmp_path / "x.pt")


def test_the_architecture_is_read_off_the_shapes(tmp_path) -> None:
    state = _keys(c=4, layers=3, vocab=11)
    layout = read_layout(state, {"n_head": 2}, tmp_path / "x.pt")
    assert (layout.n_layer, layout.n_embd, layout.vocab_size, layout.n_head) == (3, 4, 11, 2)
    assert (layout.n_positions, layout.linear_bias, layout.conv1d, layout.tied) == (16, True, False, True)
    assert layout.scheme_from_keys is None  # no wpe, no h_attn: --scheme must say
    assert sorted(layout.state) == ["blocks.0.attn.c_attn.bias", "blocks.0.attn.c_attn.weight",
                                    "blocks.1.attn.c_attn.bias", "blocks.1.attn.c_attn.weight",
                                    "blocks.2.attn.c_attn.bias", "blocks.2.attn.c_attn.weight",
                                    "embed.weight"]  # the mask buffers dropped  # fmt: skip
    assert torch.equal(layout.state["blocks.1.attn.c_attn.weight"], state["transformer.h.1.attn.c_attn.weight"])


def test_compile_ddp_and_transformers_prefixes_are_stripped_and_conv1d_transposed(tmp_path) -> None:
    state = _keys(c=4, layers=1)
    conv1d = {k.removeprefix("transformer."): v.t() if k.endswith("c_attn.weight") else v for k, v in state.items()}
    prefixed = {f"module._orig_mod.module.{k}": v for k, v in conv1d.items()}  # DDP around compile around DDP
    layout = read_layout(prefixed, {}, tmp_path / "x.pt")
    assert layout.conv1d and layout.n_embd == 4 and layout.n_layer == 1
    assert torch.equal(layout.state["blocks.0.attn.c_attn.weight"], state["transformer.h.0.attn.c_attn.weight"])


def test_a_head_equal_to_the_embedding_is_tied_and_another_is_kept(tmp_path) -> None:
    state = _keys()
    layout = read_layout({**state, "lm_head.weight": state["transformer.wte.weight"].clone()}, {}, tmp_path / "x.pt")
    assert layout.tied and "lm_head.weight" not in layout.state
    other = state["transformer.wte.weight"] + 1
    layout = read_layout({**state, "lm_head.weight": other}, {}, tmp_path / "x.pt")
    assert not layout.tied and torch.equal(layout.state["lm_head.weight"], other)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s.pop("transformer.wte.weight"), "does not look like a nanoGPT/GPT-2 state dict"),
    (lambda s: [s.pop(k) for k in list(s) if k.startswith("transformer.h.1.")], r"lacks blocks \[1\]"),
    (lambda s: [s.pop(k) for k in list(s) if k.startswith("transformer.h.")], "holds no transformer blocks"),
    (lambda s: s.__setitem__("transformer.h.0.attn.c_attn.weight", torch.zeros(5, 4)),
     r"c_attn\.weight has shape \(5, 4\), expected \(12, 4\)"),
    (lambda s: s.__setitem__("transformer.h.1.attn.c_attn.weight", torch.zeros(12, 4, 1)),
     r"transformer\.h\.1\.attn\.c_attn\.weight has shape \(12, 4, 1\); expected 2 dimensions"),
    (lambda s: s.pop("transformer.h.0.attn.c_attn.weight"), "no attn.c_attn.weight"),
])  # fmt: skip
def test_keys_and_shapes_that_do_not_add_up_are_refused(tmp_path, edit, message: str) -> None:
    state = _keys(c=4, layers=3)
    edit(state)
    with pytest.raises(BiasvizError, match=message):
        read_layout(state, {}, tmp_path / "x.pt")


def test_transformers_gpt2_model_keys_behind_prefixes_give_its_own_attention(tmp_path) -> None:
    """GPT2Model's keys (no ``transformer.``, no head) behind DDP's and torch.compile's prefixes: the rebuilt model's
    weights are transformers' eager ``output_attentions``, q.k scaled and GELU tanh as GPT-2's."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=V, n_positions=32, attn_implementation="eager")
    hf = GPT2Model(config).eval()
    torch.save({"model": {f"module._orig_mod.{k}": v for k, v in hf.state_dict().items()},
                "model_args": {"n_head": 2}}, tmp_path / "gpt2.pt")  # fmt: skip
    adapter = load_state_dict_model(tmp_path / "gpt2.pt")
    assert (adapter.scheme, adapter.architecture) == ("learned", "gpt2-state-dict")
    assert (adapter.n_heads, adapter.max_length) == (2, 32)
    assert adapter.model.config.activation == "gelu_tanh"
    x = torch.as_tensor(ids(2))
    with full_matrices(adapter, [0], want_bias=False) as cap:
        adapter.forward(x)
    with torch.no_grad():
        expected = hf(x, output_attentions=True).attentions[0]
    torch.testing.assert_close(cap.weights[0], expected, atol=2e-6, rtol=0)


def test_state_dict_files_and_nanogpt_folders_are_opened(tmp_path) -> None:
    for name in ("a.pt", "b.PTH", "c.bin", "d.ckpt", "e.safetensors", "f.json", "g.txt"):
        (tmp_path / name).write_bytes(b"")
    for folder, files in (("out", ["ckpt.pt"]), ("hf", ["ckpt.pt", "config.json"]), ("empty", [])):
        (tmp_path / folder).mkdir()
        for f in files:
            (tmp_path / folder / f).write_bytes(b"")
    opens = sorted(p.name for p in tmp_path.iterdir() if NanoGPTAdapter.can_open(p))
    assert opens == ["a.pt", "b.PTH", "c.bin", "d.ckpt", "e.safetensors", "out"]
