"""Schemes that add no attention bias (:mod:`biasviz.schemes.absolute`): GPT-2's learned absolute positions, added to
the token embeddings, and NoPE, where only the causal mask tells tokens apart. Checked on tiny models against what
follows from that by hand: with NoPE, a one-layer model's last logits do not change when the tokens before the last
are shuffled, and a run of one token attends uniformly, 1/(i + 1) to each of the i + 1 keys it sees."""

from __future__ import annotations

import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.errors import BiasvizError
from biasviz.extraction.full_matrices import full_matrices
from biasviz.schemes import get_scheme
from biasviz.schemes.absolute import Learned, NoPE
from tests.conftest import small_model

T = 12


def test_the_absolute_schemes_are_registered_and_add_no_bias() -> None:
    assert get_scheme("learned") is Learned and get_scheme("nope") is NoPE
    for cls in (Learned, NoPE):
        assert not cls.adds_bias and not cls.context_dependent and not cls.rotary
        with pytest.raises(NotImplementedError):  # never called: there is no bias to compute
            cls(4, 16).bias(None, 3, 3)
    assert Learned.absolute_positions and not NoPE.absolute_positions
    for name in ("learned", "nope"):
        model = small_model(name, n_layer=1)
        assert not model.blocks[0].attn.adds_bias and list(model.blocks[0].attn.pos_bias.parameters()) == []


def _last_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[:, -1]


def _with_strong_positions(model: torch.nn.Module) -> torch.nn.Module:
    """Position embeddings of the tokens' own scale (initialised at 0.02, they barely move a tiny model)."""
    with torch.no_grad():
        model.pos_embed.weight.normal_(0, 1, generator=torch.Generator().manual_seed(3))
    return model


def _every_weight_drawn(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter drawn at the scale of 1 (at their initial 0.02, attention barely moves a tiny model's logits)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1, generator=g)
    return model


def test_without_positions_the_order_of_earlier_tokens_does_not_matter() -> None:
    """One layer of causal attention: the last position attends to the set of the tokens before it, a sum that
    no reordering changes; with learned positions each token carries its place, and the sum changes."""
    ids = torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(1))
    shuffled = torch.cat([ids[:, :-1][:, torch.randperm(T - 1, generator=torch.Generator().manual_seed(2))],
                          ids[:, -1:]], dim=1)  # fmt: skip
    assert not torch.equal(ids, shuffled)
    nope = _every_weight_drawn(small_model("nope", n_layer=1))
    torch.testing.assert_close(_last_logits(nope, shuffled), _last_logits(nope, ids), atol=1e-4, rtol=1e-5)
    learned = _every_weight_drawn(small_model("learned", n_layer=1))
    assert (_last_logits(learned, shuffled) - _last_logits(learned, ids)).abs().max() > 0.1


def test_without_positions_a_run_of_one_token_attends_uniformly() -> None:
    ids = torch.full((1, T), 5)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    uniform = causal / torch.arange(1, T + 1)[:, None]  # row i: 1/(i + 1) over keys 0..i
    nope = BiasGPTAdapter(small_model("nope"), source="test")
    with full_matrices(nope, [0, 1], want_bias=False) as cap:
        nope.forward(ids)
    for layer in (0, 1):
        torch.testing.assert_close(cap.weights[layer][0], uniform.expand(12, T, T), atol=1e-6, rtol=0)
    learned = BiasGPTAdapter(_with_strong_positions(small_model("learned")), source="test")
    with full_matrices(learned, [0], want_bias=False) as cap:
        learned.forward(ids)
    assert not torch.allclose(cap.weights[0][0], uniform.expand(12, T, T), atol=1e-3)


def test_learned_positions_are_added_to_the_token_embeddings_and_bound_the_length() -> None:
    model = small_model("learned", n_positions=16)
    ids = torch.randint(0, 97, (2, T), generator=torch.Generator().manual_seed(4))
    seen: list[torch.Tensor] = []
    model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad():
        model(ids)
    expected = model.embed.weight[ids] + model.pos_embed.weight[:T]  # token i gets position i's row
    torch.testing.assert_close(seen[0], expected, atol=0, rtol=0)
    assert model.max_length == 16 and model.pos_embed.weight.shape == (16, 48)
    with pytest.raises(BiasvizError, match="sequence length 17 exceeds the 16 positions of this 'learned' model"):
        model(torch.zeros(1, 17, dtype=torch.long))
    nope = small_model("nope", n_positions=16)
    assert nope.max_length is None and nope.pos_embed is None
    with torch.no_grad():
        assert nope(torch.zeros(1, 40, dtype=torch.long)).logits.shape == (1, 40, 97)  # any length
