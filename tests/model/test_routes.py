"""Which route each attention call takes, over every combination of what the choice reads: autograd on or off,
a hook listening (at the bias, the weights or the scores) or none, dropout, each ``BIASVIZ_ATTENTION`` value, a
scheme without a bias, with a distance table (ALiBi), with only a difference of sums (CABLE) or with no compact
form (FIRE), a length below or above ``fused.MIN_LEN``, attention that fits in one block of the recomputation or
not, blocks of rows asked for (``block_elements``) or not, a trace intercepting calls, FlexAttention known not to
build here, and (training) a device where flex has a backward.

A tiny model's attention runs on the CPU and :func:`fused.took` says which route it took; the expected route is
:func:`expected` below, written from the rules as the docs state them, not from the code that chooses. The
compiled kernels are stubbed (their numbers are other tests'): what is checked is the choice alone."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, blocked_grad, flex_grad, fused

HOOKS = ("none", "bias", "pattern", "scores")
SHORT, LONG, MIN_LEN = 8, 24, 16  # fused.MIN_LEN lowered: lengths below and above it stay tiny


def expected(*, grad: bool, hook: str, dropout: bool, mode: str, scheme: str, long: bool, one_block: bool,
             blocks_set: bool, intercepted: bool, flex_failed: bool, backward: bool,
             cpu: bool = True) -> str:  # fmt: skip
    """The route of one call, from the rules of docs and docstrings (model.fused, model.modeling)."""
    bias = scheme != "nope"
    compact = scheme in ("alibi", "cable")  # FIRE's bias has no compact form
    table = scheme == "alibi"  # a bias of i - j alone: a distance table
    if grad:  # training
        if not bias:  # SDPA's causal kernel, unless the weights are listened to
            return "dense" if hook == "pattern" else "causal"
        # the bias fused into a kernel only where nobody listens, no dropout, not sdpa, a compact form, and
        # (on the CPU) attention too large to keep whole
        if hook != "none" or dropout or mode == "sdpa" or not compact or (cpu and one_block):
            return "dense"
        if backward and mode in ("auto", "flex") and not flex_failed:
            return "flex"
        return "blocked-grad"
    listened = hook in ("pattern", "scores")  # the weights formed block by block
    if not bias and not listened:
        return "causal"
    if listened:
        return "eager"
    if hook == "bias" or dropout or mode == "sdpa" or not compact:
        return "blocked"
    may_table = table and not blocks_set and not intercepted
    if may_table and (mode == "table" or (mode == "auto" and cpu)):
        return "table"
    if mode == "table":
        return "blocked"
    if mode == "auto" and not long:  # not worth a compilation
        return "blocked"
    return "blocked" if flex_failed else "flex"


class _Intercepting(torch.overrides.TorchFunctionMode):
    """What a trace is to the attention: a torch function mode that sees every call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        return func(*args, **(kwargs or {}))


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled kernels stubbed (zeros of their output's shape), the length threshold lowered, no kernel counted
    as compiled yet."""
    monkeypatch.setattr(fused, "MIN_LEN", MIN_LEN)
    monkeypatch.setattr(fused, "_shapes", set())
    monkeypatch.setattr(fused, "attend_or_none", lambda q, k, v, terms, scale: torch.zeros_like(q))
    monkeypatch.setattr(fused, "attend", lambda q, k, v, terms, scale: q * 0)
    monkeypatch.setattr(flex_grad, "unavailable", lambda device, terms: None)


def _attention(scheme: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = BiasGPTConfig(scheme=scheme, n_layer=1, n_head=2, n_embd=16, vocab_size=97, n_positions=64,
                           dropout=0.1)  # fmt: skip
    return BiasGPTForCausalLM(config).blocks[0].attn


def _taken(attn: torch.nn.Module, grad: bool, long: bool, intercepted: bool) -> dict[str, int]:
    x = torch.randn(1, LONG if long else SHORT, 16)
    fused.forget_routes()
    with torch.set_grad_enabled(grad), _Intercepting() if intercepted else contextlib.nullcontext():
        attn(x)
    return fused.routes_taken()


@pytest.mark.slow  # 4000 tiny forwards: about 20 s on 2 cores
@pytest.mark.parametrize("scheme", ["nope", "alibi", "cable", "fire"])
@pytest.mark.parametrize("mode", ["auto", "flex", "table", "sdpa"])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_each_call_takes_the_route_the_rules_give(grad: bool, mode: str, scheme: str, kernels: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("BIASVIZ_ATTENTION", mode)
    attn = _attention(scheme)
    # facts that matter on one side only are left at one value on the other
    sides = ((False, True), (False, True)) if grad else ((False,), (False,))
    # a trace matters to the distance table only (and SDPA's causal kernel under one is another test's matter)
    other = ((False,), (False,)) if grad else ((False, True), (False, True) if scheme == "alibi" else (False,))
    wrong = []
    for hook, dropout, long, flex_failed, one_block, backward, blocks_set, intercepted in itertools.product(
        HOOKS, (False, True), (False, True), (False, True), *sides, *other
    ):
        monkeypatch.setattr(fused, "_probe", {"cpu": "no compiler here"} if flex_failed else {})
        monkeypatch.setattr(blocked_grad, "one_block", lambda q, fits=one_block: fits)
        monkeypatch.setattr(fused, "backward_runs", lambda device, runs=backward: runs)
        attn.block_elements = 1 << 20 if blocks_set else None
        attn.train(dropout)
        handle = None if hook == "none" else getattr(attn, f"hook_{hook}").register_forward_hook(lambda *a: None)
        try:
            got = _taken(attn, grad, long, intercepted)
        finally:
            if handle is not None:
                handle.remove()
        facts = dict(grad=grad, hook=hook, dropout=dropout, mode=mode, scheme=scheme, long=long, one_block=one_block,
                     blocks_set=blocks_set, intercepted=intercepted, flex_failed=flex_failed, backward=backward)
        if got != {expected(**facts): 1}:
            wrong.append(f"{facts}: took {got}, expected {expected(**facts)}")
    assert not wrong, f"{len(wrong)} calls took another route:\n" + "\n".join(wrong[:20])


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_a_kernel_that_does_not_build_falls_back(grad: bool, kernels: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """flex chosen, its kernel not built here (no compiler; the backward's probe failing): the blocked route."""
    monkeypatch.setenv("BIASVIZ_ATTENTION", "flex")
    monkeypatch.setattr(fused, "_probe", {})
    monkeypatch.setattr(fused, "attend_or_none", lambda q, k, v, terms, scale: None)
    monkeypatch.setattr(fused, "backward_runs", lambda device: True)
    monkeypatch.setattr(blocked_grad, "one_block", lambda q: False)
    monkeypatch.setattr(flex_grad, "unavailable", lambda device, terms: "no compiler here")
    attn = _attention("alibi").eval()
    assert _taken(attn, grad, True, False) == {"blocked-grad" if grad else "blocked": 1}


@pytest.mark.parametrize("scheme", ["nope", "alibi", "cable", "fire"])
def test_the_chooser_gives_the_rules_routes_on_a_gpu_too(scheme: str) -> None:
    """:func:`routes.choose` itself, for a device the tests cannot run on: its answers against the same rules."""
    from biasviz.model import routes

    wrong = []
    for grad, hook, dropout, mode, long, one_block, blocks_set, intercepted, flex_failed, backward in itertools.product(
        (False, True), HOOKS, (False, True), ("auto", "flex", "table", "sdpa"), *[(False, True)] * 6
    ):
        compact = scheme in ("alibi", "cable")
        facts = routes.Facts(grad=grad, adds_bias=scheme != "nope", hook_bias=hook == "bias",
                             hook_pattern=hook == "pattern", hook_scores=hook == "scores", dropout=dropout, mode=mode,
                             device="cuda", seq_len=LONG if long else SHORT, min_len=MIN_LEN, one_block=one_block,
                             table_allowed=not blocks_set, intercepted=intercepted, flex_failed=flex_failed,
                             backward_runs=backward, has_terms=compact, has_table=scheme == "alibi")  # fmt: skip
        want = expected(grad=grad, hook=hook, dropout=dropout, mode=mode, scheme=scheme, long=long, one_block=one_block,
                        blocks_set=blocks_set, intercepted=intercepted, flex_failed=flex_failed, backward=backward,
                        cpu=False)  # fmt: skip
        got = routes.choose(facts)
        if got.name != want:
            wrong.append(f"{facts}: {got}, expected {want}")
        if got.name == "flex":  # a compiled kernel that does not build: the blocked route of its side
            assert got.fallback == ("blocked-grad" if grad else "eager" if hook in ("pattern", "scores") else "blocked")
    assert not wrong, f"{len(wrong)} wrong:\n" + "\n".join(wrong[:20])
