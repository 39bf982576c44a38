"""Attention written out in eager PyTorch: q.kᵀ, scale, + bias, softmax, with no fused call to intercept.

The function mode that sees SDPA also sees every tensor operation, so the trace follows the dataflow: the
product of two activations of three or more dimensions (``matmul``, ``@``, ``bmm``, ``baddbmm``, a
two-operand ``einsum``; never a parameter, so no language-model head) starts a score tensor; the
elementwise steps after it are followed — scaling, adding a tensor (the bias; a per-row constant is
dropped, since the softmax cannot see it), masking (``masked_fill``/``where`` with -inf or a stand-in at
or below the masked threshold), casts, and ``cat`` with extra columns (attention sinks); a softmax over its
last dimension is one attention call. Its weights are that softmax's own output; its bias is what was
added, scaled as the scores were. A step that is not additive (``tanh`` softcapping, a tensor product, a
convolution over heads) is named in the call's note and no bias is recorded. Nothing is copied or patched:
every operation runs as the model wrote it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from numbers import Number
from typing import Any

import torch

from biasviz.tracing.calls import AttentionCall, _is_causal, _threshold

PRODUCTS = frozenset({"matmul", "bmm", "baddbmm", "einsum"})
ADD = frozenset({"add", "add_", "__add__", "__radd__", "__iadd__"})
SUB = frozenset({"sub", "sub_", "__sub__", "__isub__"})
MUL = frozenset({"mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply"})
DIV = frozenset({"div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide"})
MASK = frozenset({"masked_fill", "masked_fill_"})
SAME = frozenset({"to", "float", "double", "half", "bfloat16", "type_as", "contiguous", "clone", "detach"})
SOFTMAX = frozenset({"softmax", "_softmax"})


@dataclass(frozen=True)
class Scores:
    """What is known of a score tensor since its product: the added bias (scaled along) and what broke it."""

    bias: torch.Tensor | None = None
    note: str = ""
    columns: tuple[int, int] | None = None  # (start, stop) of the real keys after a cat with sink columns


def _activation(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() >= 3 and not isinstance(t, torch.nn.Parameter)


def _scalar(x: Any) -> float | None:
    if isinstance(x, Number) and not isinstance(x, bool):
        return float(x)  # type: ignore[arg-type]
    if isinstance(x, torch.Tensor) and x.numel() == 1 and x.dtype != torch.bool:
        return float(x)
    return None


def _masks(value: Any, dtype: torch.dtype) -> bool:
    """Whether a fill value masks: -inf or a stand-in at or below the masked threshold."""
    s = _scalar(value)
    if s is not None:
        return s <= _threshold(dtype)
    return isinstance(value, torch.Tensor) and bool((value <= _threshold(dtype)).all())


class EagerTracker:
    """Score tensors in flight, by identity (weakly held), and what each has been through."""

    def __init__(self) -> None:
        self._scores: dict[int, tuple[weakref.ref, Scores]] = {}

    def __bool__(self) -> bool:
        return bool(self._scores)

    def get(self, t: Any) -> Scores | None:
        if not isinstance(t, torch.Tensor):
            return None
        entry = self._scores.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def _set(self, t: torch.Tensor, scores: Scores) -> None:
        key = id(t)

        def gone(ref: weakref.ref, key: int = key) -> None:
            entry = self._scores.get(key)
            if entry is not None and entry[0] is ref:
                del self._scores[key]

        self._scores[key] = (weakref.ref(t, gone), scores)

    def after(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Follow one operation that ran: start, carry or drop a score tensor."""
        if name in PRODUCTS:
            self._product(name, args, kwargs, out)
            return
        if not self._scores or not isinstance(out, torch.Tensor):
            return
        joined = name in ("cat", "concat", "concatenate")
        flat = list(args[0]) if joined and args else list(args)
        flat += [] if joined else list(kwargs.values())
        found = [(i, s) for i, a in enumerate(flat) if (s := self.get(a)) is not None]
        if not found:
            return
        i, scores = found[0]
        if len(found) > 1 and name not in MASK | {"where"}:
            self._set(out, replace(scores, note=scores.note or "two products of activations added before the "
                                   "softmax (a content-dependent term)"))  # fmt: skip
            return
        if joined:
            kwargs = {"dim": args[1] if len(args) > 1 else kwargs.get("dim", 0)}
        carried = self._carry(name, i, flat, kwargs, scores, out)
        if carried is not None:
            self._set(out, carried)

    def _product(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.dim() < 3:
            return
        if name == "einsum":
            ops = list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else list(args[1:])
            if len(ops) == 2 and all(_activation(o) for o in ops):
                self._set(out, Scores())
            return
        first, second = (args[1], args[2]) if name == "baddbmm" else (args[0], args[1])
        if not (_activation(first) and _activation(second)):
            return
        bias = None
        if name == "baddbmm":  # beta * input + alpha * (q @ k): alpha is the scale, beta * input the bias
            beta = kwargs.get("beta", 1)
            bias = (args[0] if beta == 1 else args[0] * beta) if beta and isinstance(args[0], torch.Tensor) else None
        self._set(out, Scores(bias=bias))

    def _carry(self, name: str, i: int, flat: list[Any], kwargs: dict[str, Any], s: Scores,
               out: torch.Tensor) -> Scores | None:  # fmt: skip
        x = flat[i]
        other = flat[1 - i] if len(flat) > 1 and i < 2 else None
        if name in SAME:
            return s if out.shape == x.shape else None
        if name in ADD | SUB:
            sign = (-1.0 if name in SUB else 1.0) * float(kwargs.get("alpha", 1))
            if i != 0 and name in SUB:
                return replace(s, note=s.note or "the scores are subtracted from a term (negated)")
            return self._added(s, other, sign, x)
        if name in MUL | DIV:
            factor = _scalar(other)
            if factor is None:
                return replace(s, note=s.note or f"the scores are {'multiplied' if name in MUL else 'divided'} "
                                                 "by a tensor")  # fmt: skip
            if name in DIV and i != 0:
                return replace(s, note=s.note or "a number divided by the scores")
            factor = factor if name in MUL else 1.0 / factor
            return replace(s, bias=None if s.bias is None else s.bias * factor)
        if name in MASK:
            value = flat[2] if len(flat) > 2 else kwargs.get("value")
            return s if i == 0 and _masks(value, x.dtype) else replace(s, note=s.note or "masked_fill with a "
                                                                           "value that does not mask")  # fmt: skip
        if name == "where":
            fill = flat[2] if i == 1 else flat[1]
            return s if i in (1, 2) and _masks(fill, x.dtype) else replace(s, note=s.note or "torch.where between "
                                                                             "the scores and other values")  # fmt: skip
        if name in ("cat", "concat", "concatenate"):
            dim = kwargs["dim"]
            tensors = [t for t in flat if isinstance(t, torch.Tensor)]
            if dim not in (-1, x.dim() - 1) or len(tensors) < 2:
                return None
            start = sum(t.shape[-1] for t in tensors[:i])
            return replace(s, columns=(start, start + x.shape[-1]))
        if name in SOFTMAX:
            return None
        if out.shape == x.shape and out.is_floating_point():  # any other elementwise step: not additive
            what = "softcapping (tanh)" if name.startswith("tanh") else name
            return replace(s, note=s.note or f"{what} applied to the scores before the softmax")
        return None

    @staticmethod
    def _added(s: Scores, other: Any, sign: float, x: torch.Tensor) -> Scores:
        if isinstance(other, torch.Tensor) and other.numel() > 1 and other.shape[-1] > 1:
            term = other if sign == 1.0 else other * sign  # held, not copied: a call not recorded costs nothing
            return replace(s, bias=term if s.bias is None else s.bias + term)
        return s  # a number, or one value per row: the softmax cannot see it


def softmax_dim(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The dimension a ``softmax`` call normalises (``F.softmax``, ``torch.softmax``, ``Tensor.softmax``)."""
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim if isinstance(dim, int) else None


def eager_call(index: int, x: torch.Tensor, s: Scores, out: torch.Tensor, record: bool,
               inspect: bool) -> AttentionCall:  # fmt: skip
    """One softmax over a score tensor: its weights (the softmax's own output), bias, masks and sink share."""
    x4, out4 = (_bhqk(t) for t in (x, out))
    start, stop = s.columns if s.columns is not None else (0, x4.shape[-1])
    batch, heads, q_len = x4.shape[:3]
    call = AttentionCall(index, "eager", batch, heads, q_len, stop - start, note=s.note)
    if s.note:
        call.note = s.note + ": not additive, no bias recorded"
    if not (record or inspect):
        return call
    with torch.no_grad():
        kept = x4[..., start:stop] > _threshold(x.dtype)
        call.causal = _is_causal(kept)
        bias = None
        if s.bias is not None and not s.note:
            b = _bhqk(s.bias.float().expand(*x.shape[:-1], s.bias.shape[-1]))
            if b.shape[-1] == x4.shape[-1]:  # added after a cat with sink columns: the real keys' part
                b = b[..., start:stop]
            if b.shape[-1] == stop - start and bool(b.masked_fill(~kept, 0).ne(0).any()):
                bias = b.masked_fill(~kept, float("nan"))
        call.adds_bias = bias is not None
        if record:
            call.bias = bias
            # a copy: the model may change its tensor in place after the softmax (a row-zeroing masked_fill_)
            call.weights = out4[..., start:stop].to(torch.float32, copy=True)
            if s.columns is not None:
                call.sink = out4[..., :start].float().sum(-1) + out4[..., stop:].float().sum(-1)
    return call


def _bhqk(t: torch.Tensor) -> torch.Tensor:
    """(..., Tq, Tk) as (B, H, Tq, Tk): 2-D is one sample of one head, 3-D one head per sample."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t.unsqueeze(1)
    return t.reshape(-1, *t.shape[-3:]) if t.dim() > 4 else t
