"""What is known of a score tensor between its q.kᵀ product and the softmax (:mod:`biasviz.tracing.scores`): the terms
added to it, replayed through the scale and the reshapes the scores went through, sum to what those steps do to the
scores (a linear map: f(S + b) - f(S) = f(b)); the product's operands give back a q and a k whose product is the
scores, for ``@`` and for einsum in several layouts, and nothing where that cannot be followed."""

from __future__ import annotations

import pytest
import torch

from biasviz.tracing.scores import Scores, Term

B, H, T, E = 2, 3, 5, 4


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _replay(x: torch.Tensor, steps: list[tuple[str, tuple[int, ...]]]) -> torch.Tensor:
    for kind, arg in steps:
        x = x.permute(arg) if kind == "permute" else x.reshape(arg)
    return x


# --- terms ---------------------------------------------------------------------------------------------------------
def test_a_term_goes_through_the_scale_and_the_reshapes_the_scores_went_through() -> None:
    """Heads folded into the batch (B*H, T, T), a bias of one row per head added there, then the scores viewed as
    (B, H, T, T), heads moved to the front, scaled by 0.5: the term formed is what those steps did to the scores
    beyond what they did to the product alone."""
    product = torch.randn(B * H, T, T, generator=_g(0), dtype=torch.float64)
    bias = torch.randn(1, T, T, generator=_g(1), dtype=torch.float64)
    steps = [("reshape", (B, H, T, T)), ("permute", (1, 0, 2, 3))]
    scores = Scores(terms=(Term(bias, tuple(product.shape)),))
    for step in steps:
        scores = scores.stepped(step)
    scores = scores.scaled(0.5)
    expected = (_replay(product + bias, steps) - _replay(product, steps)) * 0.5
    (term,) = scores.terms
    assert term.factor == 0.5 and term.steps == tuple(steps) and scores.steps == tuple(steps) and scores.scale == 0.5
    formed = term.formed()
    assert formed.dtype == torch.float32 and formed.shape == (H, B, T, T)
    torch.testing.assert_close(formed, expected.float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(scores.bias(), expected.float(), atol=1e-6, rtol=0)


def test_a_term_with_no_steps_is_its_tensor_in_float32_times_its_factor() -> None:
    bias = torch.randn(1, H, T, T, generator=_g(2)).to(torch.bfloat16)
    assert Term(bias, (B, H, T, T)).formed().dtype == torch.float32
    assert torch.equal(Term(bias, (B, H, T, T)).formed(), bias.float())  # broadcastable, not expanded
    assert torch.equal(Term(bias, (B, H, T, T), factor=-2.0).formed(), bias.float() * -2.0)


def test_the_bias_is_the_sum_of_the_terms_each_with_its_own_scale() -> None:
    a = torch.randn(1, H, T, T, generator=_g(3))
    b = torch.randn(B, 1, 1, T, generator=_g(4))
    scores = Scores(terms=(Term(a, (B, H, T, T)),)).scaled(0.25)  # a added before the scale, b after it
    scores = Scores(terms=(*scores.terms, Term(b, (B, H, T, T))), scale=scores.scale)
    torch.testing.assert_close(scores.bias(), a * 0.25 + b, atol=1e-6, rtol=0)
    assert Scores().bias() is None


def test_a_step_leaves_the_scores_it_was_taken_from_as_they_were() -> None:
    term = Term(torch.zeros(1, T, T), (B * H, T, T))
    before = Scores(terms=(term,), note="")
    after = before.stepped(("reshape", (B, H, T, T))).scaled(2.0).noted("first").noted("second")
    assert before.terms[0] is term and before.steps == () and before.scale == 1.0 and before.note == ""
    assert after.note == "first" and after.terms[0].factor == 2.0  # the first note stands


# --- q and k from the product's operands ---------------------------------------------------------------------------
def _qk(seed: int, q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(*q_shape, generator=_g(seed)), torch.randn(*k_shape, generator=_g(seed + 100))


def test_q_and_k_of_a_matmul_give_back_its_product() -> None:
    q, k = _qk(5, (B, H, T, E), (B, H, T, E))
    kt = k.transpose(-2, -1)
    got = Scores(operands=(q, kt), lead=(B, H)).q_and_k()
    assert got is not None
    torch.testing.assert_close(got[0] @ got[1].transpose(-2, -1), q @ kt, atol=1e-6, rtol=0)
    assert torch.equal(got[0], q) and torch.equal(got[1], k)


@pytest.mark.parametrize(("equation", "q_shape", "k_shape"), [
    ("bhqd,bhkd->bhqk", (B, H, T, E), (B, H, T, E)),
    ("bqhd,bkhd->bhqk", (B, T, H, E), (B, T, H, E)),  # positions before heads
    ("bhqd,bkd->bhqk", (B, H, T, E), (B, T, E)),  # one key head shared by every query head
    ("qd,bhkd->bhqk", (T, E), (B, H, T, E)),  # one query for the batch
    ("bhdq,bhdk->bhqk", (B, H, E, T), (B, H, E, T)),  # the summed letter first
])  # fmt: skip
def test_q_and_k_of_an_einsum_give_back_its_product(equation: str, q_shape, k_shape) -> None:
    q, k = _qk(6, q_shape, k_shape)
    product = torch.einsum(equation, q, k)
    got = Scores(operands=(q, k), equation=equation, lead=tuple(product.shape[:-2])).q_and_k()
    assert got is not None
    qq, kk = got
    assert qq.shape == (B, H, T, E) and kk.shape == (B, H, T, E)
    torch.testing.assert_close(qq @ kk.transpose(-2, -1), product, atol=1e-5, rtol=0)


def test_q_and_k_follow_the_reshapes_of_the_scores() -> None:
    q, k = _qk(7, (B, H, T, E), (B, H, T, E))
    product = q @ k.transpose(-2, -1)
    steps = [("permute", (1, 0, 2, 3)), ("reshape", (H * B, T, T))]
    scores = Scores(operands=(q, k.transpose(-2, -1)), lead=(B, H))
    for step in steps:
        scores = scores.stepped(step)
    got = scores.q_and_k()
    assert got is not None
    torch.testing.assert_close(got[0] @ got[1].transpose(-2, -1), _replay(product, steps), atol=1e-6, rtol=0)


@pytest.mark.parametrize("scores", [
    Scores(),  # no product recorded
    Scores(operands=(torch.zeros(B, T, E), torch.zeros(B, E, T))),  # its leading dimensions unknown
    Scores(operands=(torch.zeros(B, T, E), torch.zeros(B, E, T)), lead=(B,), axes=(-3, -1)),  # a moved axis
    Scores(operands=(torch.zeros(B, T, E), torch.zeros(B, E, T)), lead=(B,)).stepped(("permute", (0, 2, 1))),
    Scores(operands=(torch.zeros(B, T, E), torch.zeros(B, T, E)), equation="...qd,...kd->...qk", lead=(B,)),
    Scores(operands=(torch.zeros(B, H, T, E), torch.zeros(B, H, T, E)), equation="bhqd,bhkd->bqk", lead=(B,)),
    Scores(operands=(torch.zeros(B, T, E), torch.zeros(B, T, E)), equation="bqd,bkd", lead=(B,)),
    Scores(operands=(torch.zeros(B, T, E), torch.zeros(B, T, E)), equation="bqd,bqd->bqq", lead=(B,)),
])  # fmt: skip
def test_q_and_k_are_none_where_they_cannot_be_followed(scores: Scores) -> None:
    assert scores.q_and_k() is None
