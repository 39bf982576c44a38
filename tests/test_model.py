"""The GPT-2 variant: hook points, the two attention paths, checkpoints, length limits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from biasviz.common.errors import BiasvizError
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, capture, hook_name, hook_points
from biasviz.model.config import PRESETS
from tests.conftest import ALL_SCHEMES, RELATIVE_SCHEMES, small_model


def test_hook_names_are_pinned() -> None:
    names = sorted(hook_points(small_model("alibi")))
    assert names == [
        "blocks.0.attn.hook_bias", "blocks.0.attn.hook_pattern",
        "blocks.1.attn.hook_bias", "blocks.1.attn.hook_pattern",
    ]  # fmt: skip
    assert hook_name(1, "hook_pattern") == "blocks.1.attn.hook_pattern"


def test_presets_have_gpt2_small_shape_and_twelve_heads() -> None:
    assert PRESETS["gpt2-small"] == {
        "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257,
    }  # fmt: skip
    assert PRESETS["tiny"]["n_head"] == 12
    cfg = BiasGPTConfig.from_preset("gpt2-small", "alibi")
    n_params = sum(p.numel() for p in BiasGPTForCausalLM(cfg).parameters())
    assert 123_000_000 < n_params < 125_000_000  # GPT-2 small: 124M with tied embeddings, less wpe


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_fused_and_eager_paths_agree(scheme: str) -> None:
    model = small_model(scheme)
    ids = torch.randint(0, 97, (2, 33))
    with torch.no_grad():
        fused = model(ids).logits
        seen: list[torch.Tensor] = []
        with capture(model, "blocks.*.attn.hook_pattern", lambda t, n: seen.append(t)):
            eager = model(ids).logits
    assert len(seen) == 2 and seen[0].shape == (2, 12, 33, 33)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)


def test_hooks_are_removed_after_the_block_even_on_error() -> None:
    model = small_model("alibi")
    with pytest.raises(RuntimeError), capture(model, "blocks.1.attn.*", lambda t, n: None):
        assert all(p.active for n, p in hook_points(model).items() if n.startswith("blocks.1"))
        raise RuntimeError
    assert not any(p.active for p in hook_points(model).values())


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
    with torch.no_grad(), capture(model, "blocks.1.attn.hook_bias", lambda t, n: got.update({n: t})):
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


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(BiasvizError, match="multiple of n_head"):
        BiasGPTConfig(scheme="alibi", n_embd=50, n_head=12)
    with pytest.raises(BiasvizError, match="unknown preset"):
        BiasGPTConfig.from_preset("huge", "alibi")


def _softmax_reference(q, k, bias, masked, scale):  # noqa: ANN001, ANN202
    """Attention weights computed independently, in float64 with an explicit exp / sum."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if bias is not None:
        s = s + bias.double()
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("bias_batch", [None, 1, 2])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("block_elements", [7, 40, 10_000])  # one row per block, a few rows, one block
@pytest.mark.parametrize("batched", [False, True])  # per (sample, head) as on the CPU, or all at once as on a GPU
def test_blocked_pattern_equals_reference_softmax(
    bias_batch: int | None, causal: bool, block_elements: int, batched: bool
) -> None:
    from biasviz.model.modeling import attend_blocked, attention_pattern_blocked, causal_mask

    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 19, 8
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    bias = None if bias_batch is None else torch.randn(bias_batch, H, T, T, generator=g)
    masked = causal_mask(T, T, torch.device("cpu")) if causal else None
    got = attention_pattern_blocked(q, k, bias, masked, 0.3, block_elements=block_elements, batched=batched)
    want = _softmax_reference(q, k, bias, masked, 0.3)
    assert got.shape == (B, H, T, T) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    if causal:
        assert (got[..., masked] == 0).all()  # keys never computed hold exact zeros
    torch.testing.assert_close(attend_blocked(got, v, masked).double(), want @ v.double(), rtol=0, atol=1e-5)


def test_eager_path_keeps_gradients_when_training() -> None:
    model = small_model("alibi").train()
    ids = torch.randint(0, 97, (2, 12))
    with capture(model, "blocks.*.attn.hook_pattern", lambda t, n: None):
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
