"""Training attention through compiled FlexAttention on a GPU: the bias inside the kernel, forward and backward.

The blocked recomputation (:mod:`biasviz.model.blocked_grad`) keeps no (query, key) cell, but it is a Python loop
over blocks of rows: on a GPU its step was 9.1x the flash step in bf16 and 2.4x in fp32, bound by launches, not
arithmetic. FlexAttention's backward is the same recomputation fused into one kernel, and the gradient of a bias's
parameters (ALiBi's slopes, KERPLE's r1 and r2, a distance table computed from FIRE's network or T5's buckets,
CABLE's per-position values) comes from the kernel's scatter of each cell's gradient into the tensors the score
modifier reads (torch's support for captured tensors that require grad). Where the compiled backward cannot be
built for a bias's form (:func:`unavailable`, probed once per device and form on a small shape before the first real
step), the blocked recomputation runs instead, with the same numbers, and a warning says so once.

FlexAttention has no backward on the CPU, so the CPU trains through the blocked recomputation; the tests prove this
route's arithmetic (its score modifier under autograd) on the CPU through flex's eager reference, in float64.
"""

from __future__ import annotations

import threading
import warnings

import torch

from biasviz.model import fused
from biasviz.schemes.base import ScoreTerms

PROBE_LEN = fused.BLOCK + 16  # the probe's positions: a block on the diagonal, a full one and a partial row
_lock = threading.Lock()
_probe: dict[tuple[str, str], str | None] = {}  # (device type, form) -> None (builds) or why not


def form(terms: ScoreTerms) -> str:
    """Which score modifier the kernel compiles for ``terms``: ``formula``, ``distance`` or ``ends``."""
    return "formula" if terms.formula is not None else "distance" if terms.distance is not None else "ends"


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: ScoreTerms, scale: float) -> torch.Tensor | None:
    """Causal softmax(scale q k^T + b) v, differentiable in q, k, v and the tensors of ``terms``, through compiled
    FlexAttention: (B, H, T, hd). None where this route does not run here (then the caller's blocked recomputation
    does)."""
    if fused.route(q.device, q.shape[-2], terms, table=False, grad=True) != "flex":
        return None
    return run(q, k, v, terms, scale)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: ScoreTerms, scale: float) -> torch.Tensor | None:
    """:func:`attend` once its route is chosen (:func:`biasviz.model.routes.choose`): None where the compiled
    backward does not build for ``terms``' form here, or one more kernel would pass torch's recompile limit."""
    if unavailable(q.device, terms) is not None or not fused.fits(q, terms):
        return None
    return fused.attend(q, k, v, terms, scale)


def unavailable(device: torch.device, terms: ScoreTerms) -> str | None:
    """None where the compiled forward and backward of ``terms``' form build and run on ``device``, else why not:
    a forward and a backward on :data:`PROBE_LEN` positions, once per device type and form. The probe's bias is
    a detached copy: nothing of it reaches the model's gradients."""
    key = (device.type, form(terms))
    with _lock:
        if key not in _probe:
            try:
                _probe[key] = _try(device, _small(terms, PROBE_LEN))
            except Exception as err:  # a lowering the compiler lacks: the blocked recomputation runs
                _probe[key] = f"{type(err).__name__}: {err}".splitlines()[0][:200]
            if _probe[key] is not None:
                warnings.warn(f"FlexAttention's backward does not build on {device.type} for a bias given as "
                              f"{key[1]} ({_probe[key]}); training takes the blocked recomputation (the same numbers, "
                              "slower)", stacklevel=3)  # fmt: skip
        return _probe[key]


def _try(device: torch.device, terms: ScoreTerms) -> str | None:
    q = torch.randn(1, _heads(terms), PROBE_LEN, 16, device=device, requires_grad=True)
    if not fused.fits(q, terms):  # one compilation more than torch allows
        return "torch's recompile limit is reached"
    out = fused.attend(q, q, q, terms, 0.25)
    tracked = [t for t in _tensors(terms) if t.requires_grad]
    grads = torch.autograd.grad(out.float().square().sum(), [q, *tracked])
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        return "non-finite gradients"
    return None


def _heads(terms: ScoreTerms) -> int:
    if terms.distance is not None:
        return terms.distance.shape[0]
    if terms.ends is not None:
        return terms.ends.shape[1]
    return terms.formula[1][0].shape[0]


def _tensors(terms: ScoreTerms) -> list[torch.Tensor]:
    if terms.formula is not None:
        return list(terms.formula[1])
    return [terms.distance if terms.distance is not None else terms.ends]


def _small(terms: ScoreTerms, length: int) -> ScoreTerms:
    """A bias of ``terms``' form for ``length`` positions, of its dtype and device, requiring grad where ``terms``
    does: the formula's parameters copied (their values keep its arithmetic finite), a table or ends of zeros."""
    if terms.formula is not None:
        value, params = terms.formula
        return ScoreTerms(formula=(value, tuple(p.detach().clone().requires_grad_(p.requires_grad) for p in params)))
    like = terms.distance if terms.distance is not None else terms.ends
    heads = _heads(terms)
    shape = (heads, 2 * length - 1) if terms.distance is not None else (1, heads, length)
    zeros = torch.zeros(shape, dtype=like.dtype, device=like.device, requires_grad=like.requires_grad)
    return ScoreTerms(distance=zeros) if terms.distance is not None else ScoreTerms(ends=zeros)
