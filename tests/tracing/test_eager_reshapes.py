"""Eager attention traced through reshapes of its leading dimensions, relative terms gathered by position, and
learned bias tables that hold zeros: DeBERTa v1 and v2 (heads folded into the batch for ``bmm``, c2p + p2c added),
Swin and BEiT through eager and SDPA, each against the library's own reference (``output_attentions``, the
model's own bias modules run in float64, the table gathered by its own index), with the outputs unchanged."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import biasviz

TOL = 1e-5


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a.double() - b.double()).abs() <= TOL).all())


def traced(model: torch.nn.Module, *args: object, **kwargs: object):  # noqa: ANN201
    """The traced forward, checked bit for bit against the untraced one."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with biasviz.trace(model) as t:
            out = model(*args, **kwargs).last_hidden_state
        assert torch.equal(out, model(*args, **kwargs).last_hidden_state)
    return t


# --- DeBERTa ----------------------------------------------------------------------------------------------------
IDS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
PADDED = torch.ones(2, 12, dtype=torch.long)
PADDED[1, -3:] = 0  # sample 1 has 3 padding tokens at its end


def deberta(version: int, **extra: object) -> torch.nn.Module:
    from transformers import DebertaConfig, DebertaModel, DebertaV2Config, DebertaV2Model

    config_cls, model_cls = (DebertaConfig, DebertaModel) if version == 1 else (DebertaV2Config, DebertaV2Model)
    config = config_cls(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, relative_attention=True, pos_att_type=["c2p", "p2c"],
                        max_relative_positions=16, **extra)  # fmt: skip
    torch.manual_seed(0)
    return model_cls._from_config(config, attn_implementation="eager").eval()


def relative_terms_float64(model: torch.nn.Module, ids: torch.Tensor = IDS,
                           mask: torch.Tensor | None = PADDED) -> list[torch.Tensor]:  # fmt: skip
    """c2p + p2c of every layer, as the model's own bias method returns them, run in a float64 copy."""
    twin = copy.deepcopy(model).double()
    found: list[torch.Tensor] = []
    for layer in twin.encoder.layer:
        attention = layer.attention.self
        name = "disentangled_att_bias" if hasattr(attention, "disentangled_att_bias") else "disentangled_attention_bias"
        own = getattr(attention, name)

        def keep(*args: object, own=own) -> torch.Tensor:  # noqa: ANN001
            found.append(out := own(*args))
            return out

        setattr(attention, name, keep)
    with torch.no_grad():
        twin(ids) if mask is None else twin(ids, attention_mask=mask)
    return found


@pytest.mark.parametrize(("version", "extra"), [
    (1, {}),
    (2, {}),
    (2, {"position_buckets": 8, "share_att_key": True, "norm_rel_ebd": "layer_norm"}),  # DeBERTa-v3's layout
])  # fmt: skip
def test_deberta_relative_terms_are_the_bias(version: int, extra: dict) -> None:
    model = deberta(version, **extra)
    t = traced(model, IDS, attention_mask=PADDED)
    with torch.no_grad():
        expected = model(IDS, attention_mask=PADDED, output_attentions=True).attentions
    relative = relative_terms_float64(model)
    kept = (PADDED[:, None, :, None] * PADDED[:, None, None, :]).bool().expand(2, 4, 12, 12)
    assert [c.kind for c in t.calls] == ["eager", "eager"] and t.notes == {}
    for layer in range(2):
        assert close(t.weights[layer], expected[layer])
        bias = t.bias[layer]
        assert bias.shape == (2, 4, 12, 12) and torch.isnan(bias[~kept]).all()
        assert close(bias[kept], relative[layer].view(2, 4, 12, 12)[kept])  # (B*H, T, T) in the model's bmm


def test_deberta_extract_stores_its_content_dependent_bias_per_sample(tmp_path) -> None:
    """The relative terms depend on the input: stored per sample as measured, each sample's its own."""
    import h5py

    path = tmp_path / "deberta.h5"
    ids = torch.randint(0, 100, (3, 12), generator=torch.Generator().manual_seed(1))
    model = deberta(2)
    biasviz.extract(model, ids, path, layers=-1)
    with h5py.File(path) as f:
        stored = torch.from_numpy(f["layer_1/bias"][...])
    assert stored.shape == (3, 4, 12, 12) and (stored[0] - stored[1]).abs().max() > 1e-3
    t = traced(model, ids[2:])
    assert close(stored[2:], t.bias[1])


# --- Swin and BEiT --------------------------------------------------------------------------------------------
PIXELS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def vision(kind: str, attention: str, table: str) -> torch.nn.Module:
    from transformers import BeitConfig, BeitModel, SwinConfig, SwinModel

    torch.manual_seed(0)
    if kind == "swin":
        config = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2], num_heads=[2], window_size=4)
        model = SwinModel._from_config(config, attn_implementation=attention).eval()
    else:
        config = BeitConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, use_relative_position_bias=True)  # fmt: skip
        model = BeitModel._from_config(config, attn_implementation=attention).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                assert bool((p == 0).all())  # zero at initialisation, as both libraries set it
                if table == "trained":
                    p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return model


def own_table(model: torch.nn.Module, layer: int) -> torch.Tensor:
    """The layer's table gathered by its own relative-position index, as (1, H, T, T) (independent of the trace)."""
    if hasattr(model, "encoder"):  # Swin
        module = model.encoder.layers[0].blocks[layer].attention.relative_position_bias
        index = module.relative_position_index
    else:  # BEiT: the index is generated for the patch grid, with the class token's three extra distances
        module = model.layers[layer].relative_position_bias
        index = module.generate_relative_position_index(module.window_size)
    n = int(math.isqrt(index.numel()))
    gathered = module.relative_position_bias_table.detach()[index.reshape(-1)]
    return gathered.view(n, n, -1).permute(2, 0, 1)[None].float()


@pytest.mark.parametrize("kind", ["swin", "beit"])
@pytest.mark.parametrize("table", ["zero", "trained"])
def test_learned_tables_in_one_layout_through_eager_and_sdpa(kind: str, table: str) -> None:
    eager, sdpa = (traced(vision(kind, a, table), PIXELS) for a in ("eager", "sdpa"))
    assert [c.kind for c in eager.calls] == ["eager"] * 2 and [c.kind for c in sdpa.calls] == ["sdpa"] * 2
    model = vision(kind, "eager", table)
    for layer in range(2):
        assert eager.calls[layer].adds_bias and sdpa.calls[layer].adds_bias  # a zero table is still a bias
        assert eager.bias[layer].shape == sdpa.bias[layer].shape
        assert torch.equal(eager.bias[layer], sdpa.bias[layer]) and close(eager.weights[layer], sdpa.weights[layer])
    assert close(eager.bias[0], own_table(model, 0))  # Swin's layer 1 adds its shifted-window mask too
    if kind == "beit":
        assert close(eager.bias[1], own_table(model, 1))


# --- written out here -------------------------------------------------------------------------------------------
H, T, D = 3, 8, 4


def folded(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, when: str) -> torch.Tensor:
    """Scores as (B*H, T, T) from bmm, a bias added before or after the view back to (B, H, T, T)."""
    b = q.shape[0]
    s = torch.bmm(q.reshape(b * H, T, D), k.reshape(b * H, T, D).transpose(1, 2)) / math.sqrt(D)
    if when == "folded":
        s = s + bias.repeat(b, 1, 1)
    s = s.view(b, H, T, T)
    if when == "unfolded":
        s = s + bias
    if when == "permuted":  # heads to the front and back again, the bias added in between
        s = (s.permute(1, 0, 2, 3) + bias[:, None]).permute(1, 0, 2, 3)
    return s.softmax(-1)


@pytest.mark.parametrize("when", ["folded", "unfolded", "permuted"])
def test_a_bias_added_around_reshapes_lands_on_its_cells(when: str) -> None:
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, H, T, D, generator=g) for _ in range(2))
    bias = torch.randn(H, T, T, generator=g, dtype=torch.float64).float()
    with biasviz.trace() as t:
        out = folded(q, k, bias, when)
    assert torch.equal(out, folded(q, k, bias, when)) and t.notes == {}
    expected = (q.double() @ k.double().transpose(-2, -1) / math.sqrt(D) + bias.double()).softmax(-1)
    assert close(t.weights[0], expected) and close(t.bias[0], bias[None])


def test_a_relative_shift_is_the_bias_and_moved_scores_are_noted() -> None:
    """Transformer-XL: a position product shifted into place and added is the bias (the model's own cells);
    the scores themselves shifted before the softmax cannot be followed: noted, no bias."""
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, H, T, D, generator=g) for _ in range(2))
    r = torch.randn(2, H, 2 * T - 1, D, generator=g)  # one embedding per distance

    def shift(x: torch.Tensor) -> torch.Tensor:  # pad, view, drop a row: row i moves left by T - 1 - i
        b, h, n, m = x.shape
        return torch.nn.functional.pad(x, (1, 0)).view(b, h, m + 1, n)[:, :, 1:].reshape(b, h, n, m)[..., :n]

    def attention(moved: bool) -> torch.Tensor:
        ac = q @ k.transpose(-2, -1)
        bd = q @ r.transpose(-2, -1)
        return shift(ac + bd[..., :T]).softmax(-1) if moved else (ac + shift(bd)).softmax(-1)

    with biasviz.trace() as t:
        out = attention(moved=False)
    assert torch.equal(out, attention(moved=False)) and t.notes == {}
    expected = shift(q.double() @ r.double().transpose(-2, -1))
    assert close(t.bias[0], expected) and close(t.weights[0], out)
    with biasviz.trace() as t:
        attention(moved=True)
    assert t.bias == {} and "moved" in t.notes[0]


def test_heads_mixed_by_an_einsum_are_noted() -> None:
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, H, T, D, generator=g) for _ in range(2))
    mix = torch.nn.Parameter(torch.randn(H, H, generator=g))
    with biasviz.trace() as t:
        torch.einsum("bhij,hg->bgij", q @ k.transpose(-2, -1), mix).softmax(-1)
    assert t.bias == {} and "mixed" in t.notes[0] and t.weights[0].shape == (2, H, T, T)


def test_deberta_scores_are_its_content_product_plus_the_relative_terms() -> None:
    """``--capture scores`` of an eager call: the softmax's input, q·kᵀ / √(3d) (float64, from the model's own
    projections) plus c2p + p2c; its softmax is ``output_attentions``; the call's q and k give the first part."""
    from biasviz.tracing.mode import Trace

    model = deberta(2)
    with torch.no_grad(), Trace(model, scores=True) as t:
        model(IDS, attention_mask=PADDED)
    with torch.no_grad():
        expected = model(IDS, attention_mask=PADDED, output_attentions=True).attentions
    twin = copy.deepcopy(model).double()
    keep: dict[int, torch.Tensor] = {}
    for index, layer in enumerate(twin.encoder.layer):
        layer.attention.self.register_forward_pre_hook(lambda m, a, index=index: keep.__setitem__(index, a[0]))
    with torch.no_grad():
        twin(IDS, attention_mask=PADDED)
    kept = (PADDED[:, None, :, None] * PADDED[:, None, None, :]).bool().expand(2, 4, 12, 12)
    for layer in range(2):
        attention = twin.encoder.layer[layer].attention.self
        q, k = (attention.transpose_for_scores(proj(keep[layer]), 4).view(2, 4, 12, 16)
                for proj in (attention.query_proj, attention.key_proj))  # fmt: skip
        content = q @ k.transpose(-2, -1) / math.sqrt(16 * 3)  # c2p and p2c: a scale factor of 3
        scores = t.scores[layer]
        assert torch.isnan(scores[~kept]).all()
        assert close(scores[kept] - t.bias[layer][kept], content[kept])
        call = t.calls[layer]  # the call's own q and k (the operands of its bmm, folded back to (B, H, T, E))
        assert call.q is not None and call.q.shape == (2, 4, 12, 16) and call.k.shape == (2, 4, 12, 16)
        assert close((call.scale * call.q @ call.k.transpose(-2, -1))[kept], content[kept])
        assert close(scores.nan_to_num(float("-inf")).softmax(-1)[kept], expected[layer][kept])


# --- a bias of the batch added to one sample's scores ------------------------------------------------------------
class _SharedScores(torch.nn.Module):
    """One text's q·kᵀ (batch 1) plus a relative bias of batch 2, the sum then folded to (B·H, T, T) and back."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def qk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(f(x).view(1, 5, 2, 4).transpose(1, 2) for f in (self.q, self.k))  # (1, H, T, E)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x)
        scores = q @ k.transpose(-1, -2) / 2.0 + mask  # (1, H, T, T)
        scores = scores + bias  # (2, H, T, T): the scores grow to the bias's batch
        scores = scores.reshape(-1, 5, 5).reshape(2, 2, 5, 5)
        return torch.softmax(scores, dim=-1)


def test_a_bias_of_the_batch_added_to_one_samples_scores_is_formed() -> None:
    """The terms and the product follow the scores to the batch the bias broadcasts them to (the call was left
    unformed: 'expanded size (1) must match (2)'); bias, weights and scores against the module's own numbers."""
    from biasviz.tracing.mode import Trace

    model = _SharedScores()
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1))
    mask = torch.randn(1, 1, 5, 5, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), Trace(model, [0], scores=True) as t:
        out = model(x, mask, bias)
    with torch.no_grad():
        q, k = model.qk(x)
        scores = q @ k.transpose(-1, -2) / 2.0 + mask + bias  # (2, H, T, T)
    assert [c.note for c in t.calls] == [""]
    assert close(t.weights[0], out) and close(t.bias[0], (mask + bias).expand(2, 2, 5, 5))
    assert close(t.scores[0], scores)
    call = t.calls[0]  # q and k as the call's: the product broadcast with the scores
    assert call.q is not None and call.k is not None
    assert close(call.scale * call.q @ call.k.transpose(-1, -2) + mask + bias, scores)


class _Folded(torch.nn.Module):
    """fairseq's attention (and XGLM's in transformers): heads folded into the batch for ``bmm``, (B·H, T, T), the
    padding mask added through a (B, H, T, T) view and a floor at the dtype's minimum, the softmax over the 3-D
    scores."""

    def __init__(self, d: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv = heads, torch.nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2).reshape(b * self.heads, t, -1)
                   for y in self.qkv(x).chunk(3, -1))  # fmt: skip
        scores = torch.bmm(q * (d // self.heads) ** -0.5, k.transpose(1, 2))  # (B·H, T, T)
        scores = scores.view(b, self.heads, t, t) + mask
        scores = torch.max(scores, torch.full((), torch.finfo(scores.dtype).min))  # XGLM's floor: masks nothing more
        weights = torch.softmax(scores.view(b * self.heads, t, t), dim=-1)
        return torch.bmm(weights, v).view(b, self.heads, t, -1).transpose(1, 2).reshape(b, t, d)


def test_heads_folded_into_the_batch_are_unfolded_by_the_view_the_scores_went_through() -> None:
    """The (B·H, T, T) softmax is (B, H, T, T) as the scores' own view on their way said: each head its own, every
    sample its own, against float64; the floor at the dtype's minimum is no step of the scores (scale·q·kᵀ + the mask
    stays what the call took in: its q and k are kept)."""
    torch.manual_seed(0)
    model = _Folded().eval()
    x = torch.randn(2, 10, 16)
    causal = torch.full((10, 10), float("-inf")).triu(1)
    mask = causal[None, None].repeat(2, 1, 1, 1)
    mask[1, :, 3:, :3] = float("-inf")  # sample 1 left-padded by 3 (its padded queries see the padding alone)
    from biasviz.tracing import Trace

    with torch.no_grad(), Trace(model, scores=True) as t:
        model(x, mask)
    (call,) = t.calls
    assert (call.batch, call.heads, call.q_len, call.k_len) == (2, 4, 10, 10)
    with torch.no_grad():
        q, k, _ = (y.double().view(2, 10, 4, 4).transpose(1, 2) for y in model.qkv(x).chunk(3, -1))
        want = torch.softmax(q @ k.transpose(-1, -2) / 2.0 + mask.double(), -1)
    torch.testing.assert_close(call.weights.double(), want, rtol=0, atol=1e-6)
    assert call.q is not None and call.q.shape == (2, 4, 10, 4)  # its q and k kept, per head
