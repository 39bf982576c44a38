"""Training through FlexAttention (forward and backward): the route a GPU takes, its arithmetic proven on the CPU.

FlexAttention has no backward on the CPU; its eager reference does, once torch's device check is set aside. So the
tests run the very score modifier the GPU compiles, under autograd, through flex's eager path, and compare the
outputs and every gradient (q, k, v and the bias's own parameters) with softmax(scale q k^T + b) v formed cell by
cell in float64 from the scheme's bias, and a whole model's training step with the full-matrix path.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, blocked_grad, flex_grad, fused
from biasviz.schemes import SCHEMES
from tests.model.test_blocked_grad import _step as blocked_step

T = 160  # two of flex's blocks of 128, the second partial


@pytest.fixture(autouse=True)
def _recomputed(monkeypatch) -> None:
    """These tests are about the recomputation: their small models take it too (a CPU otherwise keeps attention
    that fits in one block whole, tests/model/test_routes_training.py)."""
    monkeypatch.setattr(blocked_grad, "one_block", lambda q: False)


@pytest.fixture
def flex_on_cpu(monkeypatch):
    """The GPU's training route on the CPU: flex's backward allowed here, its eager reference for the compiled
    kernel (the same score modifier and block mask), a fresh probe."""
    monkeypatch.setattr(fused, "backward_runs", lambda device: True)
    monkeypatch.setattr(fused, "_compiled", lambda: flex_module.flex_attention)
    monkeypatch.setattr(flex_module, "_validate_device", lambda *args: None)
    monkeypatch.setattr(flex_grad, "_probe", {})
    monkeypatch.setenv("BIASVIZ_ATTENTION", "auto")
    fused.forget_routes()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def _trained(scheme: str) -> torch.nn.Module:
    """The scheme's bias with its learned parameters moved off their initial values, in float64."""
    torch.manual_seed(0)
    pos = SCHEMES[scheme](n_head=4, d_model=16).double()
    with torch.no_grad():
        for p in pos.parameters():
            p.add_(0.3 * torch.randn_like(p))
    pos.constrain_()
    return pos


# each form the kernel compiles: a formula (one parameter, two), a distance table (T5's buckets), per-position values
@pytest.mark.parametrize("scheme", ["alibi", "kerple-power", "t5", "cable"])
def test_flex_route_gradients_equal_the_cell_by_cell_math_in_float64(scheme: str, flex_on_cpu) -> None:
    pos = _trained(scheme)
    g = torch.Generator().manual_seed(1)
    B, H, hd = 1, 4, 8
    x = torch.randn(B, T, 16, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(B, H, T, hd, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    upstream = torch.randn(B, H, T, hd, generator=g, dtype=torch.float64)
    params = [p for p in pos.parameters() if p.requires_grad]
    terms = pos.score_terms(x)
    scale = 1 / math.sqrt(hd)
    out = flex_grad.attend(q, k, v, terms, scale)
    assert out is not None, "the flex route did not run"
    got = torch.autograd.grad(out, [q, k, v, *params], upstream, allow_unused=True)
    bias = pos(x, T, T)  # (1 or B, H, T, T): the scheme's own bias, every cell
    i = torch.arange(T)
    scores = (q @ k.transpose(-2, -1)) * scale + bias
    reference = torch.softmax(scores.masked_fill(i[None, :] > i[:, None], float("-inf")), dim=-1) @ v
    want = torch.autograd.grad(reference, [q, k, v, *params], upstream, allow_unused=True)
    assert (out - reference).abs().max() <= 1e-10 * reference.abs().max()
    assert len(params) == 0 or any(w is not None for w in want[3:])
    # a bias the scheme forms in float32 (CABLE's cumulative sums) has gradients of float32's rounding
    compact = terms.ends if terms.ends is not None else terms.distance
    tol = 1e-9 if compact.dtype == torch.float64 else 1e-4
    for a, b in zip(got, want, strict=True):
        if b is None:
            continue
        assert a is not None, "a parameter of the bias got no gradient through flex"
        assert (a - b).abs().max() <= tol * max(b.abs().max().item(), 1e-12)


def _step(scheme: str, mode: str, monkeypatch) -> tuple[float, dict[str, torch.Tensor]]:
    """A small model's training step (one layer, one window of T tokens) under ``BIASVIZ_ATTENTION=mode``."""
    return blocked_step(scheme, mode, monkeypatch, t=T, layers=1, width=32, windows=1)


def test_a_training_step_through_flex_equals_the_full_matrix_path(flex_on_cpu, monkeypatch) -> None:
    """A whole model in float32 (KERPLE's two parameters per head): the route is taken (counted) and gives the
    full-matrix path's loss and gradients."""
    scheme = "kerple-power"
    loss, grads = _step(scheme, "auto", monkeypatch)
    assert fused.routes_taken() == {"flex": 1}
    fused.forget_routes()
    loss_full, grads_full = _step(scheme, "sdpa", monkeypatch)
    assert fused.routes_taken() == {"dense": 1}
    assert abs(loss - loss_full) <= 1e-5 * abs(loss_full)
    assert grads.keys() == grads_full.keys()
    for name, g in grads_full.items():
        assert (grads[name] - g).abs().max() <= 1e-4 * max(g.abs().max().item(), 1e-6), name


def test_the_cpu_trains_through_the_blocked_recomputation(monkeypatch) -> None:
    monkeypatch.setenv("BIASVIZ_ATTENTION", "auto")
    fused.forget_routes()
    _step("alibi", "auto", monkeypatch)
    assert fused.routes_taken() == {"blocked-grad": 1}
    assert fused.route(torch.device("cpu"), T, _trained("alibi").score_terms(torch.zeros(1, T, 1)), grad=True) is None


def test_a_backward_that_does_not_build_falls_back_with_one_warning(flex_on_cpu, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("LoweringException: no lowering for this bias")

    monkeypatch.setattr(fused, "attend", broken)
    with pytest.warns(UserWarning, match="FlexAttention's backward does not build on cpu"):
        loss, _ = _step("alibi", "auto", monkeypatch)
    assert math.isfinite(loss) and fused.routes_taken() == {"blocked-grad": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # told once per device and form
        _step("alibi", "auto", monkeypatch)


def test_the_probe_leaves_the_models_gradients_alone(flex_on_cpu) -> None:
    pos = _trained("kerple-log")
    terms = pos.score_terms(torch.zeros(1, 64, 1, dtype=torch.float64))
    assert flex_grad.unavailable(torch.device("cpu"), terms) is None
    assert all(p.grad is None for p in pos.parameters())


@pytest.mark.cuda
@pytest.mark.parametrize("scheme", ["alibi", "kerple-log", "t5", "cable"])
def test_a_training_step_through_compiled_flex_on_cuda_equals_the_full_matrix_path(scheme: str, monkeypatch) -> None:
    """On a GPU the backward is compiled by Triton: every form's loss and gradients against every cell at once."""
    monkeypatch.setattr(flex_grad, "_probe", {})
    steps = {}
    for mode in ("auto", "sdpa"):
        monkeypatch.setenv("BIASVIZ_ATTENTION", mode)
        fused.forget_routes()
        torch.manual_seed(0)
        config = BiasGPTConfig(scheme=scheme, n_layer=2, n_head=4, n_embd=64, vocab_size=97, n_positions=1024)
        model = BiasGPTForCausalLM(config).cuda().train()
        ids = torch.randint(1, 97, (2, 1024), generator=torch.Generator().manual_seed(1)).cuda()
        loss = model(ids, labels=ids).loss
        loss.backward()
        steps[mode] = loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        if mode == "auto":
            assert fused.routes_taken() == {"flex": 2}, flex_grad._probe
    (loss, grads), (loss_full, grads_full) = steps["auto"], steps["sdpa"]
    assert abs(loss - loss_full) <= 1e-4 * abs(loss_full)
    for name, g in grads_full.items():
        assert (grads[name] - g).abs().max() <= 1e-3 * max(g.abs().max().item(), 1e-6), name
