"""Attention written out in eager PyTorch: q.kᵀ, scale, + bias, softmax, with no fused call to intercept.

The function mode that sees SDPA also sees every tensor operation, so the trace follows the dataflow: the
product of two activations of three or more dimensions (``matmul``, ``@``, ``bmm``, ``baddbmm``, a
two-operand ``einsum``; never a parameter, so no language-model head) starts a score tensor; the
elementwise steps after it are followed — scaling, adding a tensor (the bias; a per-row constant is
dropped, since the softmax cannot see it), masking (``masked_fill``/``where`` with -inf or a stand-in at
or below the masked threshold), casts, and ``cat`` with extra columns (attention sinks) — and so are
reshapes that only merge, split or reorder the leading (batch, head) dimensions (``view``, ``reshape``,
``flatten``, ``unflatten``, ``permute``, ``transpose``: DeBERTa folds heads into the batch for ``bmm``), each
cell followed to where it lands; a softmax over its last dimension is one attention call (over (B·H, Tq, Tk) scores,
fairseq's and XGLM's, its heads unfolded by the (B, H, Tq, Tk) view the scores went through). Its weights are
that softmax's own output; its bias is what was added, scaled and reshaped as the scores were.

A product whose cells are then moved (a ``gather`` by relative position, a pad-and-shift) is no longer
q.kᵀ cell for cell: DeBERTa's content-to-position and position-to-content terms, Transformer-XL's shifted
position term. Added to the scores, such a term is part of the bias, exactly as the model added it
(content-dependent: its context dependence is measured, not assumed); reaching the softmax by itself, it is
named in the call's note. A step that is not additive (``tanh`` softcapping, a tensor product, a mix over
heads) is named in the call's note and no bias is recorded. Nothing is copied or patched: every operation
runs as the model wrote it, and an added term is formed again only for the calls recorded.
"""

from __future__ import annotations

from dataclasses import replace
from numbers import Number
from typing import Any

import torch

from biasviz.tracing.calls import FORMED_BEFORE, AttentionCall, _is_causal, _threshold, one_layout
from biasviz.tracing.eager_kept import _bhqk, _masks_only, eager_operands
from biasviz.tracing.folds import FoldedHeads
from biasviz.tracing.identity import ByIdentity
from biasviz.tracing.provenance import Provenance
from biasviz.tracing.scores import Scores, Term

PRODUCTS = frozenset({"matmul", "bmm", "baddbmm", "einsum"})
ADD = frozenset({"add", "add_", "__add__", "__radd__", "__iadd__"})
SUB = frozenset({"sub", "sub_", "__sub__", "__isub__"})
MUL = frozenset({"mul", "mul_", "__mul__", "__rmul__", "__imul__", "multiply"})
DIV = frozenset({"div", "div_", "__truediv__", "__itruediv__", "true_divide", "divide"})
MASK = frozenset({"masked_fill", "masked_fill_"})
SAME = frozenset({"to", "float", "double", "half", "bfloat16", "type_as", "contiguous", "clone", "detach"})
SOFTMAX = frozenset({"softmax", "_softmax"})
# a floor, max(x, m): where m is at or below the masked threshold, what the call attends is unchanged
FLOOR = frozenset({"max", "maximum", "clamp_min"})
# reshapes: followed when they keep the (query, key) dimensions, and so every cell's (i, j)
RESHAPE = frozenset({"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "squeeze", "unsqueeze"})
PERMUTE = frozenset({"permute", "transpose", "transpose_", "swapaxes", "swapdims"})
# steps that move cells to other (i, j): what comes out is no longer q.kᵀ cell for cell
MOVE = frozenset(
    {"gather", "take_along_dim", "index_select", "roll", "flip", "pad", "narrow", "__getitem__", "diagonal"}
)

# what a moved product is followed through on its way to the scores it is added to
MOVED_STEPS = MOVE | RESHAPE | PERMUTE | SAME | ADD | SUB | MUL | DIV | {"cat", "concat", "concatenate", "expand",
                                                                      "expand_as", "repeat", "clamp"}


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

    def __init__(self, provenance: Provenance | None = None) -> None:
        self._scores: ByIdentity[Scores] = ByIdentity()
        self._softmaxed: ByIdentity[bool] = ByIdentity()  # the weights of the calls so far
        self.provenance = provenance or Provenance(None)
        self.folds = FoldedHeads()  # q and k with heads folded into the batch: followed by the trace's every step

    def __bool__(self) -> bool:
        return bool(self._scores)

    def get(self, t: Any) -> Scores | None:
        return self._scores.get(t)

    def softmaxed(self, weights: torch.Tensor) -> None:
        """The weights a call produced: a product of them (with v) starts no score tensor of :meth:`lost`."""
        self._softmaxed.set(weights, True)

    def was_softmaxed(self, t: torch.Tensor) -> bool:
        return self._softmaxed.get(t) is not None

    def lost(self, x: torch.Tensor) -> Scores | None:
        """A softmax over a tensor the trace did not see made, while scores of its very shape are in flight: they
        went through a step no torch function mode sees (a TorchScript function: x-transformers' softclamp), so the
        call is reported with its weights and a note rather than missed. The scores in flight are then dropped."""
        live = [s for t, s in self._scores.items() if not s.moved and t.shape == x.shape and s.operands is not None
                and not any(self.was_softmaxed(o) for o in s.operands)]  # fmt: skip
        if not live:
            return None
        self._scores.clear()
        return Scores(note="the scores went through a step the trace cannot see (a TorchScript function, say) "
                           "before the softmax")  # fmt: skip

    def _set(self, t: torch.Tensor, scores: Scores) -> None:
        self._scores.set(t, scores)

    def after(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Follow one operation that ran: start, carry or drop a score tensor."""
        if name in PRODUCTS:  # a product starts scores (or mixes heads); it never carries them
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
            self._joined(name, flat, found, out)
            return
        if joined:
            kwargs = {"dim": args[1] if len(args) > 1 else kwargs.get("dim", 0)}
        carried = self._carry(name, i, flat, kwargs, scores, out)
        if carried is not None:
            self._set(out, carried)

    def _joined(self, name: str, flat: list[Any], found: list[tuple[int, Scores]], out: torch.Tensor) -> None:
        """Two tracked tensors in one step: the scores plus a moved product is the scores with that term added."""
        still = [(i, s) for i, s in found if not s.moved]
        if len(still) == 1 and len(found) == 2 and (name in ADD and still[0][0] in (0, 1) or name in SUB and
                                                     still[0][0] == 0):  # fmt: skip
            i, scores = still[0]
            self._set(out, self._added(scores, flat[1 - i], -1.0 if name in SUB else 1.0, flat[i]))
            return
        if not still:
            self._set(out, found[0][1])
            return
        self._set(out, still[0][1].noted("two products of activations added before the softmax (a "
                                         "content-dependent term)"))  # fmt: skip

    def _product(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """A product of two activations starts a score tensor; one with tracked scores mixes them (a note)."""
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.dim() < 3:
            return
        if name == "einsum":
            ops = list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else list(args[1:])
        else:  # positional or by keyword: baddbmm(input, batch1, batch2), matmul(input, other), bmm(input, mat2)
            names = {"baddbmm": ("input", "batch1", "batch2"), "bmm": ("input", "mat2")}.get(name, ("input", "other"))
            bound = dict(zip(names, args, strict=False)) | kwargs
            ops = [bound.get(n) for n in names[-2:]]
        if name == "einsum" and (mixed := _mixes_heads(args[0], ops, self.get)) is not None:
            self._set(out, mixed.noted("the heads' scores are mixed (einsum) before the softmax"))
            return
        if not (len(ops) == 2 and all(_activation(o) for o in ops)):
            return
        folded = self.folds.heads(ops[0]) or self.folds.heads(ops[1]) or 1  # fairseq's q and k: (B·H, T, d)
        scores = Scores(operands=(ops[0], ops[1]), equation=args[0] if name == "einsum" else None,
                        lead=tuple(out.shape[:-2]), folded=folded)  # fmt: skip
        if name == "baddbmm":  # beta * input + alpha * (q @ k): alpha is the scale, beta * input the bias
            beta = kwargs.get("beta", 1)
            scores = replace(scores, scale=float(kwargs.get("alpha", 1)))
            if beta and isinstance(bound.get("input"), torch.Tensor):
                scores = self._added(scores, bound["input"], float(beta), out)
        self._set(out, scores)

    def _carry(self, name: str, i: int, flat: list[Any], kwargs: dict[str, Any], s: Scores,
               out: torch.Tensor) -> Scores | None:  # fmt: skip
        x = flat[i]
        other = flat[1 - i] if len(flat) > 1 and i < 2 else None
        if s.moved:  # a moved product: a term to add, if it is added, through the steps that move, reshape or scale
            # cells (DeBERTa's gather, Transformer-XL's pad-and-shift); not through a layer that mixes them (a linear
            # attention's products flow on into the residual stream, and a router's softmax is no attention call)
            return s if name in MOVED_STEPS and out.is_floating_point() and out.dim() >= 2 else None
        if name in SAME:
            return s if out.shape == x.shape else None
        if name in RESHAPE | PERMUTE:
            return self._reshaped(name, flat, s, x, out)
        if name in ADD | SUB:
            sign = (-1.0 if name in SUB else 1.0) * float(kwargs.get("alpha", 1))
            if i != 0 and name in SUB:
                return s.noted("the scores are subtracted from a term (negated)")
            return self._added(s, other, sign, x)
        if name in MUL | DIV:
            factor = _scalar(other)
            if factor is None:
                return s.noted(f"the scores are {'multiplied' if name in MUL else 'divided'} by a tensor")
            if name in DIV and i != 0:
                return s.noted("a number divided by the scores")
            return s.scaled(factor if name in MUL else 1.0 / factor)
        if name in FLOOR and i == 0 and other is not None and _masks(other, x.dtype):
            return s  # a floor at or below the masked threshold (XGLM: max with the dtype minimum) moves no cell
        if name in MASK:
            value = flat[2] if len(flat) > 2 else kwargs.get("value")
            return s if i == 0 and _masks(value, x.dtype) else s.noted("masked_fill with a value that does not mask")
        if name == "where":
            fill = flat[2] if i == 1 else flat[1]
            return s if i in (1, 2) and _masks(fill, x.dtype) else s.noted("torch.where between the scores and "
                                                                             "other values")  # fmt: skip
        if name in ("cat", "concat", "concatenate"):
            dim = kwargs["dim"]
            tensors = [t for t in flat if isinstance(t, torch.Tensor)]
            if dim in (-1, x.dim() - 1) and len(tensors) >= 2 and s.axes == (-2, -1):
                start = sum(t.shape[-1] for t in tensors[:i])
                return replace(s, columns=(start, start + x.shape[-1]))
        if name in SOFTMAX:
            return None
        if name not in MOVE and out.shape == x.shape and out.is_floating_point():  # elementwise: not additive
            what = "softcapping (tanh)" if name.startswith("tanh") else name
            softcap = name.startswith("tanh") and not s.note and s.capped_at is None  # c·tanh(x / c) of q·kᵀ
            return replace(s.noted(f"{what} applied to the scores before the softmax"),
                           capped_at=s.scale if softcap else None)  # fmt: skip
        if out.is_floating_point() and out.dim() >= 2 and out.shape[-1] > 1:  # cells moved: a term, if added
            return Scores(moved=True, note=f"the cells of q.kᵀ are moved ({name}) before the softmax")
        return None

    @staticmethod
    def _reshaped(name: str, flat: list[Any], s: Scores, x: torch.Tensor, out: torch.Tensor) -> Scores | None:
        """A reshape or permute: followed when each cell keeps its (query, key); the terms replay it."""
        if name in PERMUTE:
            n = x.dim()
            dims = _permutation(name, flat[1:], n)
            if dims is None:
                return None
            q, k = (a % n for a in s.axes)
            return replace(s.stepped(("permute", dims)), axes=(dims.index(q) - n, dims.index(k) - n))
        if s.axes != (-2, -1) or out.shape[-2:] != x.shape[-2:] or out.numel() != x.numel():
            return None  # the query or key dimension itself is split or merged: cells cannot be followed
        return s.stepped(("reshape", tuple(out.shape)))

    def _added(self, s: Scores, other: Any, sign: float, x: torch.Tensor) -> Scores:
        if isinstance(other, torch.Tensor) and other.numel() > 1 and other.shape[-1] > 1:
            shape = tuple(torch.broadcast_shapes(x.shape, other.shape))
            if shape != tuple(x.shape):  # a term of more samples (or heads) than the scores: they grow to its layout
                s = _grown(s, shape)
            # held, not copied: a call not recorded costs nothing
            term = Term(other, shape, sign, learned=self.provenance.learned(other))
            return replace(s, terms=(*s.terms, term))
        shifts = isinstance(other, torch.Tensor) or (isinstance(other, Number) and other != 0)
        return replace(s, shifted=True) if shifts else s  # a number, or one value per row: the softmax cannot see it


def _grown(s: Scores, shape: tuple[int, ...]) -> Scores:
    """Scores broadcast to ``shape`` by a term added to them (one sample's scores plus a bias of the batch): the
    terms before it are formed as they stand (their steps led to the scores' former layout) and broadcast with
    them; q and k follow where nothing has reshaped the product yet."""
    terms = tuple(Term(t.formed(), shape, learned=t.learned) for t in s.terms)
    lead = shape[:-2] if not s.steps and s.lead is not None else s.lead
    return replace(s, terms=terms, lead=lead)


def _mixes_heads(equation: Any, ops: list[Any], get: Any) -> Scores | None:
    """Tracked scores in an einsum that keeps their (query, key) subscripts: heads mixed (talking heads)."""
    if not isinstance(equation, str) or "->" not in equation or "." in equation:
        return None
    inputs, output = equation.replace(" ", "").split("->")
    for subscripts, op in zip(inputs.split(","), ops, strict=False):
        s = get(op)
        if s is not None and not s.moved and len(subscripts) >= 2 and output[-2:] == subscripts[-2:]:
            return s
    return None


def _permutation(name: str, rest: list[Any], n: int) -> tuple[int, ...] | None:
    """The dimension order a ``permute`` or ``transpose`` call makes, from its own arguments."""
    if name == "permute":
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], list | tuple) else rest
        return tuple(int(d) % n for d in dims) if len(dims) == n else None
    if len(rest) < 2 or not all(isinstance(d, int) for d in rest[:2]):
        return None
    a, b = rest[0] % n, rest[1] % n
    order = list(range(n))
    order[a], order[b] = order[b], order[a]
    return tuple(order)


def softmax_dim(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The dimension a ``softmax`` call normalises (``F.softmax``, ``torch.softmax``, ``Tensor.softmax``)."""
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim if isinstance(dim, int) else None


def eager_call(index: int, x: torch.Tensor, s: Scores, out: torch.Tensor, record: bool,
               inspect: bool, scores: bool = False) -> AttentionCall:  # fmt: skip
    """One softmax over a score tensor: its weights (the softmax's own output), bias, masks and sink share;
    with ``scores``, the softmax's input itself (masked cells NaN)."""
    folded = s.folded_heads(tuple(x.shape))  # (B·H, Tq, Tk) scores: the heads their own view on the way unfolds
    x4, out4 = (_bhqk(t, folded) for t in (x, out))
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
        call.forms_again = inspect and eager_operands(x, s) is not None
        bias, added = None, s.bias() if s.terms and not s.note else None
        if added is not None:
            b = _bhqk(added.expand(*x.shape[:-1], added.shape[-1]), folded)
            if b.shape[-1] == x4.shape[-1]:  # added after a cat with sink columns: the real keys' part
                b = b[..., start:stop]
            learned = any(t.learned for t in s.terms)  # a learned table is a bias even where it holds zeros
            if b.shape[-1] == stop - start and (learned or bool(b.masked_fill(~kept, 0).ne(0).any())):
                bias = one_layout(b.masked_fill(~kept, float("nan")))
        call.adds_bias = bias is not None
        if record:
            call.bias = bias
            # a copy: the model may change its tensor in place after the softmax (a row-zeroing masked_fill_)
            call.weights = out4[..., start:stop].to(torch.float32, copy=True)
            if scores:
                call.scores = x4[..., start:stop].float().masked_fill(~kept, float("nan"))
                capped = (s.capped_at is not None and s.columns is None
                          and _masks_only(s.bias(), kept, x.shape, folded))  # fmt: skip
                pair = s.q_and_k() if not s.note or capped else None
                if pair is not None and pair[0].shape[:-1] == x.shape[:-1] and pair[1].shape[-2] == stop - start:
                    q, k = _bhqk(pair[0], folded), _bhqk(pair[1], folded)
                    call.keep_operands(q, k, s.scale)  # softcapping's c·tanh(x / c): the factors cancel
                    assert call.q is not None and call.k is not None
                    if capped or s.shifted:  # the scores as the call's inputs give them: scale·q·kᵀ (+ its bias)
                        formed = (call.q @ call.k.transpose(-2, -1)) * call.scale
                        formed = formed if bias is None else formed + bias
                        call.scores = formed.masked_fill(~kept, float("nan"))
                    if capped:
                        call.note += f"; {FORMED_BEFORE} scale·q·kᵀ before that step"
                    if s.columns is not None:  # sink columns beside the keys (GPT-OSS): the keys' own part
                        sinks = f"attention-sink columns beside the keys: {FORMED_BEFORE} over the keys alone"
                        call.note = f"{call.note}; {sinks}" if call.note else sinks
            if s.columns is not None:
                call.sink = out4[..., :start].float().sum(-1) + out4[..., stop:].float().sum(-1)
    return call
