"""The GPT-2 variant: hook points, the two attention paths, checkpoints, length limits."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from biasviz.common.errors import BiasvizError
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, capture
from biasviz.schemes import SCHEMES
from tests.conftest import ALL_SCHEMES, RELATIVE_SCHEMES, small_model


def test_hook_q_and_k_pass_the_projections_split_by_head() -> None:
    model = small_model("alibi").eval()
    ids = torch.randint(0, 97, (2, 10))
    got: dict[str, torch.Tensor] = {}
    names = ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"]
    with capture(model, names, lambda t, name, _r: got.update({name: t})), torch.no_grad():
        model(ids)
    attn = model.blocks[1].attn
    with torch.no_grad():  # the layer's input, by the model's own modules, projected by hand
        x = model.blocks[0](model.embed(ids))
        w, b = attn.c_attn.weight.double(), attn.c_attn.bias.double()
        qkv = model.blocks[1].ln_1(x).double() @ w.T + b
    c = model.config.n_embd
    for name, part in (("hook_q", qkv[..., :c]), ("hook_k", qkv[..., c : 2 * c])):
        t = got[f"blocks.1.attn.{name}"]
        assert t.shape == (2, 10, model.config.n_head, c // model.config.n_head)
        np.testing.assert_allclose(t.flatten(2).double().numpy(), part.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_fused_and_eager_paths_agree(scheme: str) -> None:
    model = small_model(scheme)
    ids = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        fused = model(ids).logits
        seen: list[torch.Tensor] = []
        with capture(model, "blocks.*.attn.hook_pattern", lambda t, n, r0: seen.append(t)):
            eager = model(ids).logits
    assert len(seen) == 2 and seen[0].shape == (2, 12, 33, 33)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)


def test_fused_path_does_not_form_the_weights() -> None:
    model = small_model("fire")
    called = []
    orig = torch.softmax
    try:
        torch.softmax = lambda *a, **k: called.append(1) or orig(*a, **k)  # type: ignore[assignment]
        with torch.no_grad():
            model(torch.randint(0, 97, (1, 16)))
    finally:
        torch.softmax = orig  # type: ignore[assignment]
    assert not called


def test_bias_hook_sees_the_unmasked_bias() -> None:
    model = small_model("alibi")
    got: dict[str, torch.Tensor] = {}
    with torch.no_grad(), capture(model, "blocks.1.attn.hook_bias", lambda t, n, r0: got.update({n: t})):
        model(torch.randint(0, 97, (3, 10)))
    bias = got["blocks.1.attn.hook_bias"]
    assert bias.shape == (1, 12, 10, 10)
    assert torch.isfinite(bias).all()  # the causal mask is applied after the hook


@pytest.mark.parametrize("scheme", ["alibi", "fire", "cable", "learned"])
def test_checkpoint_round_trip_gives_identical_logits(scheme: str, tmp_path) -> None:
    model = small_model(scheme, seed=3)
    ids = torch.randint(0, 97, (2, 20))
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, BiasGPTForCausalLM) and loaded.config.scheme == scheme
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.embed.weight.data_ptr()  # tied


def test_each_layer_has_its_own_scheme_parameters_unless_shared() -> None:
    own = small_model("kerple-log")
    assert own.blocks[0].attn.pos_bias is not own.blocks[1].attn.pos_bias
    shared = small_model("kerple-log", share_position_params=True)
    assert shared.blocks[0].attn.pos_bias is shared.blocks[1].attn.pos_bias
    assert len(shared.schemes()) == 1
    n_own = sum(p.numel() for p in own.parameters())
    n_shared = sum(p.numel() for p in shared.parameters())
    assert n_own - n_shared == 2 * 12  # one layer's r1 and r2


@pytest.mark.parametrize("scheme", [*RELATIVE_SCHEMES, "nope"])
def test_relative_schemes_extrapolate_far_beyond_the_position_table(scheme: str) -> None:
    model = small_model(scheme, n_positions=128)
    with torch.no_grad():
        logits = model(torch.randint(0, 97, (1, 1024))).logits
    assert logits.shape == (1, 1024, 97) and torch.isfinite(logits).all()


def test_learned_positions_refuse_longer_inputs_clearly() -> None:
    model = small_model("learned", n_positions=128)
    model(torch.randint(0, 97, (1, 128)))
    with pytest.raises(BiasvizError, match="exceeds the 128 positions.*--seq-len 128"):
        model(torch.randint(0, 97, (1, 129)))


def test_eager_path_keeps_gradients_when_training() -> None:
    model = small_model("alibi").train()
    ids = torch.randint(0, 97, (2, 12))
    with capture(model, "blocks.*.attn.hook_pattern", lambda t, n, r0: None):
        loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.blocks[0].attn.c_attn.parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_a_hook_that_replaces_the_pattern_is_used_in_full() -> None:
    model = small_model("nope")
    ids = torch.randint(0, 97, (1, 9))
    uniform = torch.full((1, 12, 9, 9), 1 / 9)  # weight on keys the causal mask removed

    def run(fn):  # noqa: ANN001, ANN202
        with torch.no_grad():
            handle = model.blocks[1].attn.hook_pattern.register_forward_hook(fn)
            try:
                return model(ids).logits
            finally:
                handle.remove()

    replaced = run(lambda *_: uniform)
    kept = run(lambda *_: None)
    assert not torch.allclose(replaced, kept)  # the replacement, masked cells included, reached the output


def test_scores_a_hook_returns_are_never_written_to() -> None:
    """A hook may return scores it keeps, or a broadcast view no kernel can write: the weights come from a copy."""
    model = small_model("nope")
    ids = torch.randint(0, 97, (1, 9))
    row = torch.randn(1, 12, 1, 9)
    returned = row.expand(1, 12, 9, 9)  # every query the same scores: one memory location per key
    seen = {}

    def keep_pattern(module, args, out):  # noqa: ANN001, ANN202
        seen["pattern"] = out.clone()

    attn = model.blocks[1].attn
    with torch.no_grad():
        handles = [attn.hook_scores.register_forward_hook(lambda *_: returned),
                   attn.hook_pattern.register_forward_hook(keep_pattern)]  # fmt: skip
        try:
            model(ids)
        finally:
            for h in handles:
                h.remove()
    assert torch.equal(returned, row.expand(1, 12, 9, 9))
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    want = torch.softmax(returned.double().masked_fill(~causal, float("-inf")), dim=-1)
    torch.testing.assert_close(seen["pattern"].double(), want, rtol=0, atol=1e-6)


def test_initialisation_reaches_modules_whose_weights_sit_in_children() -> None:
    torch.manual_seed(0)
    model = BiasGPTForCausalLM(BiasGPTConfig.from_preset("tiny", "t5", n_layer=4))
    table = model.blocks[0].attn.pos_bias.table.weight
    assert 0.8 < table.std().item() < 1.2  # the T5 table starts at N(0, 1), not the embeddings' 0.02
    residual = model.blocks[0].attn.c_proj.weight.std().item()
    assert residual == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.05)  # GPT-2's 1/sqrt(2 n_layer)


@pytest.mark.parametrize("scheme", ["alibi", "kerple-power", "fire", "t5", "cable"])
def test_loading_keeps_trained_scheme_parameters(scheme: str, tmp_path) -> None:
    model = small_model(scheme, seed=5)
    with torch.no_grad():  # move every tensor away from its initial value, as training would
        for p in model.parameters():
            p.add_(torch.rand_like(p) * 0.05)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


# --- the blocked forward without autograd, against every cell computed independently -------------------------
SCHEME_CASES = [(name, {}) for name in SCHEMES] + [
    ("fox", {"gate": "bias_only", "decay_time_min": 2.0, "decay_time_max": 64.0}),
    ("fox", {"gate": "fixed", "decay_time_min": 2.0, "decay_time_max": 64.0}),
]
SMALL_BLOCKS = 24 * 700  # B * H * rows * keys per block at B = 2: 20 blocks of 1 to 26 rows at T = 150
ULP_SCHEMES = {"kerple-power"}  # pow's SIMD body and scalar tail round differently: equal to 1 ulp, not bitwise


def _perturbed(model: BiasGPTForCausalLM) -> BiasGPTForCausalLM:
    """Move every parameter off its initial value, so that heads and layers differ as after training."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        for s in model.schemes():
            s.constrain_()
    return model


def _rope_by_hand(x: torch.Tensor, base: float, fraction: float) -> torch.Tensor:
    """(B, H, T, hd) float64 turned pairwise: x_f + i x_{f + d/2} times exp(i * position * base^(-2f / d))."""
    d = int(x.shape[-1] * fraction) // 2 * 2
    half = d // 2
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    angle = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * theta  # (T, d/2)
    z = torch.complex(x[..., :half], x[..., half:d]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag, x[..., d:]], dim=-1)


def _reference_weights(attn: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q k^T / sqrt(d) + bias, causal) in float64 from the layer's own c_attn, by hand; and the bias."""
    B, T, C = x.shape
    H = attn.n_head
    w, b = attn.c_attn.weight.double(), attn.c_attn.bias.double()
    qkv = x.double() @ w.T + b  # (B, T, 3C)
    q, k = (qkv[..., n * C : (n + 1) * C].view(B, T, H, C // H).transpose(1, 2) for n in (0, 1))  # (B, H, T, hd)
    if attn.pos_bias.rotary:  # RoPE, by hand: pairs (f, f + d/2) of the first d dimensions turn by i * theta_f
        q, k = (_rope_by_hand(t, **attn.pos_bias.options) for t in (q, k))
    scores = q @ k.transpose(-2, -1) / math.sqrt(C // H)  # (B, H, T, T)
    bias = None
    if attn.pos_bias.adds_bias:
        bias = attn.pos_bias.bias(x, T, T)  # (1 or B, H, T, T), the scheme's own full matrix
        scores = scores + bias.double()
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True), bias


def _blocks_by_layer(model: BiasGPTForCausalLM, ids: torch.Tensor) -> tuple[dict, dict, torch.Tensor]:
    """Run ``model`` without autograd, keeping every block that passes the hook points and each layer's input."""
    got: dict[tuple[int, str], list[tuple[int, torch.Tensor]]] = {}
    inputs: dict[int, torch.Tensor] = {}

    def keep(t: torch.Tensor, name: str, row0: int) -> None:
        got.setdefault((int(name.split(".")[1]), name.rsplit(".", 1)[1]), []).append((row0, t.clone()))

    handles = [b.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0]))
               for i, b in enumerate(model.blocks)]  # fmt: skip
    try:
        with torch.no_grad(), capture(model, ["blocks.*.attn.hook_bias", "blocks.*.attn.hook_pattern"], keep):
            logits = model(ids).logits
    finally:
        for h in handles:
            h.remove()
    return got, inputs, logits


@pytest.mark.parametrize(("scheme", "options"), SCHEME_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(
    str(x) for x in v.values()))  # fmt: skip
def test_blocked_forward_equals_an_independent_full_computation(scheme: str, options: dict, monkeypatch) -> None:
    from biasviz.model.modeling import Attention

    model = _perturbed(small_model(scheme, scheme_options=options))
    B, T = 2, 150
    ids = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(2))
    full_logits = model(ids).logits.detach()  # autograd on: the training path, every cell at once
    monkeypatch.setattr(Attention, "block_elements", SMALL_BLOCKS)
    with torch.no_grad():
        bare_logits = model(ids).logits  # fused blocks (SDPA), nothing listening
    got, inputs, hooked_logits = _blocks_by_layer(model, ids)
    tol = {"rtol": 1e-5, "atol": 1e-5 * float(full_logits.abs().max())}
    torch.testing.assert_close(bare_logits, full_logits, **tol)
    torch.testing.assert_close(hooked_logits, full_logits, **tol)
    for layer, block in enumerate(model.blocks):
        want, bias = _reference_weights(block.attn, inputs[layer])
        kinds = ["hook_pattern"] + (["hook_bias"] if bias is not None else [])
        assert {k for (lay, k) in got if lay == layer} == set(kinds)
        for kind in kinds:
            blocks = got[(layer, kind)]
            starts = [r0 for r0, _ in blocks]
            ends = [r0 + t.shape[-2] for r0, t in blocks]
            assert starts == [0, *ends[:-1]] and ends[-1] == T and len(blocks) > 3  # every row, once, in order
            assert len({t.shape[-2] for _, t in blocks}) > 2  # blocks of several sizes: uneven ones exercised
            for r0, t in blocks:
                r1 = r0 + t.shape[-2]
                assert t.shape[1:] == (12, r1 - r0, r1)  # keys 0..r1-1: a query block sees no later key
                if kind == "hook_pattern":
                    assert t.shape[0] == B and t.dtype == torch.float32
                    torch.testing.assert_close(t.double(), want[:, :, r0:r1, :r1], rtol=0, atol=1e-5)
                    assert (t[..., torch.ones(r1 - r0, r1, dtype=torch.bool).triu(r0 + 1)] == 0).all()
                elif scheme in ULP_SCHEMES:
                    torch.testing.assert_close(t, bias[:, :, r0:r1, :r1], rtol=2.4e-7, atol=0)
                else:
                    assert torch.equal(t, bias[:, :, r0:r1, :r1])  # bit-equal to the scheme's full matrix


def test_training_path_passes_whole_matrices_once(monkeypatch) -> None:
    from biasviz.model.modeling import Attention

    monkeypatch.setattr(Attention, "block_elements", 1)  # however small the blocks: autograd sees every cell at once
    model = small_model("cable").train()
    ids = torch.randint(0, 97, (2, 20))
    seen: list[tuple[str, int, tuple[int, ...]]] = []
    names = ["blocks.*.attn.hook_bias", "blocks.*.attn.hook_pattern"]
    with capture(model, names, lambda t, n, r0: seen.append((n, r0, tuple(t.shape)))):
        model(ids, labels=ids).loss.backward()
    assert sorted(seen) == sorted((f"blocks.{i}.attn.{k}", 0, (2, 12, 20, 20)) for i in range(2)
                                  for k in ("hook_bias", "hook_pattern"))  # fmt: skip


@pytest.mark.parametrize("scheme", ["alibi", "cable", "fire", "nope"])
@pytest.mark.parametrize("listen", [False, True])
def test_no_grad_forward_forms_no_tensor_of_size_T_by_T(scheme: str, listen: bool, monkeypatch) -> None:
    """Every tensor any op makes stays below a quarter of one (B, H, T, T) matrix (blocks are a few rows)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from biasviz.model.modeling import Attention

    class Largest(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    monkeypatch.setattr(Attention, "block_elements", SMALL_BLOCKS)
    model = small_model(scheme)
    B, T = 2, 256
    names = ["blocks.*.attn.hook_bias", "blocks.*.attn.hook_pattern"] if listen else []
    with torch.no_grad(), Largest() as spy, contextlib.ExitStack() as stack:
        if listen:
            stack.enter_context(capture(model, names, lambda t, n, r0: None))
        model(torch.randint(0, 97, (B, T)))
    assert 0 < spy.numel < B * 12 * T * T // 4


def test_dropout_without_autograd_runs_and_drops_as_sdpa_does() -> None:
    """Monte Carlo dropout (training mode, no autograd) in a model without a bias: SDPA's causal kernel with dropout,
    whose output is laid out (B, H, T, hd), gives the layer's (B, T, C) as the same call outside the model does."""
    import torch.nn.functional as F

    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    torch.manual_seed(0)
    attn = BiasGPTForCausalLM(BiasGPTConfig(scheme="nope", n_layer=1, n_head=2, n_embd=16, vocab_size=97,
                                            n_positions=64, dropout=0.5)).blocks[0].attn.train()  # fmt: skip
    x = torch.randn(2, 24, 16)
    with torch.no_grad():
        torch.manual_seed(1)
        got = attn(x)
        q, k, v = (t.view(2, 24, 2, 8).transpose(1, 2) for t in attn.c_attn(x).split(16, dim=2))
        torch.manual_seed(1)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True, scale=attn.scale)
        want = attn.c_proj(y.transpose(1, 2).reshape(2, 24, 16))
    assert got.shape == (2, 24, 16)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
