"""``flex_attention`` calls formed explicitly: the mask_mod's cells and score_mod's additive part (the bias) evaluated
on the (batch, head, query, key) grid, as flex's own eager path evaluates them, and the weights from them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from biasviz.common.shapes import step_cells
from biasviz.tracing.calls import (
    FORMED_BEFORE,
    MASKED_BELOW,
    AttentionCall,
    CompactBias,
    SdpaOperands,
    _is_causal,
    _scores,
    _softmax_kept,
    offsets,
)


def _on_grid(fn: Callable[..., torch.Tensor], shape: tuple[int, int, int, int], device: torch.device,
             score: torch.Tensor | None = None, first_query: int = 0) -> torch.Tensor:  # fmt: skip
    """``fn`` (a score_mod or mask_mod, written for scalars) over every (b, h, q_idx, kv_idx), as flex's
    own eager path evaluates it: vmapped once per dimension; q_idx from ``first_query`` on (a block of query rows)."""
    idx = [torch.arange(n, device=device, dtype=torch.int32) for n in shape]
    idx[2] = idx[2] + first_query
    lead = () if score is None else (0,)
    mapped = fn
    for dim in (3, 2, 1, 0):  # innermost first: kv_idx, q_idx, head, batch
        in_dims = lead + tuple(0 if d == dim else None for d in range(4))
        mapped = torch.vmap(mapped, in_dims=in_dims, out_dims=0)
    # indexing a tensor with a vmapped index (``slopes[h]``) needs torch's getitem-to-index rewrite
    try:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    except ImportError:  # pragma: no cover - older or newer torch without it: plain indexing still works
        import contextlib

        TransformGetItemToIndex = contextlib.nullcontext  # noqa: N806
    with TransformGetItemToIndex():
        out = mapped(*(() if score is None else (score,)), *idx)
    return out


@dataclass
class _Flex:
    """One flex_attention call's operands and what its score_mod does, formed on the (B, H, rows, Tk) grid of some of
    its query rows."""

    q: torch.Tensor
    k: torch.Tensor
    scale: float
    kept: torch.Tensor  # (1 or B, 1 or H, rows, Tk) bool: mask_mod's cells, less those score_mod masks by itself
    before: torch.Tensor | None  # scale·q·kᵀ, float32: the scores as the call's inputs give them (None: not formed)
    formed: torch.Tensor | None  # score_mod of them: the softmax's input
    offset: torch.Tensor | None  # score_mod(0): its additive part, where it is one (None: identity)
    additive: bool  # score_mod(s) == s + score_mod(0) on the kept cells

    @property
    def adds(self) -> bool:
        """An additive part that is more than 0 and "masked" (a bias, not a mask)."""
        return self.offset is not None and self.additive and bool(torch.where(self.kept, self.offset, 0).ne(0).any())


def _flex_bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = ("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
             "score_mod_other_buffers", "mask_mod_other_buffers")  # fmt: skip
    return dict(zip(names, args, strict=False)) | kwargs


def _flex(bound: dict[str, Any], r0: int = 0, r1: int | None = None, scores: bool = True) -> _Flex:
    """The call's mask, scores and score_mod evaluated on the grid of query rows ``r0 .. r1 - 1`` (default: every
    row), as flex's own eager path evaluates them; ``scores`` False: an identity score_mod's scores are not formed
    (nothing is asked of them)."""
    q, k = bound["query"], bound["key"]
    score_mod, block_mask = bound.get("score_mod"), bound.get("block_mask")
    batch, heads, q_len = q.shape[:3]
    r1 = q_len if r1 is None else r1
    k_len = k.shape[-2]
    shape = (batch, heads, r1 - r0, k_len)
    mask_mod = block_mask[-1] if isinstance(block_mask, tuple) and block_mask else None
    if mask_mod is None:
        kept = torch.ones(1, 1, r1 - r0, k_len, dtype=torch.bool, device=q.device)
    else:
        buffers = tuple(bound.get("mask_mod_other_buffers") or ())
        kept = _on_grid(lambda *a: mask_mod(*a, *buffers), shape, q.device, first_query=r0).bool()
    scale = bound.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if score_mod is None or getattr(score_mod, "__name__", "") == "_identity":
        before = _scores(q[:, :, r0:r1], k, scale) if scores else None
        return _Flex(q, k, scale, kept, before, before, None, True)
    before = _scores(q[:, :, r0:r1], k, scale)
    buffers = tuple(bound.get("score_mod_other_buffers") or ())

    def modded(s: torch.Tensor) -> torch.Tensor:
        return _on_grid(lambda x, *a: score_mod(x, *a, *buffers), shape, q.device, score=s, first_query=r0).float()

    out = modded(before)
    # a score_mod may mask by itself (torch.where(i >= j, s + b, -inf), or finfo.min as transformers adds its mask):
    # those cells are masked, as a mask_mod's are, and not part of the bias
    kept = kept & (out > MASKED_BELOW)
    offset = modded(torch.zeros_like(before))
    checks = [_additive(before, out, offset, kept)] + [
        _additive(before.new_full((), probe).expand_as(before), modded(before.new_full(before.shape, probe)), offset,
                  kept)
        for probe in PROBES
    ]  # fmt: skip
    return _Flex(q, k, scale, kept, before, out, offset, bool(torch.stack(checks).all()))  # one read, not five


# grid cells (batch x heads x query rows x keys) a keeping trace evaluates score_mod and mask_mod on at a time: the
# probes' few float32 temporaries a block, not the whole (B, H, T, T) grid's (a GPU's step: larger, fewer blocks)
KEEP_CELLS = 1 << 22


def _narrowest(x: torch.Tensor) -> torch.Tensor:
    """``x`` (B, H, rows, K) with its batch and head dimensions 1 where its values are the same along them: a
    mask_mod or score_mod that reads neither b nor h is held once, not B·H times (one read for both)."""
    same = torch.stack([_same(x, x[:1]), _same(x, x[:, :1])]).tolist()
    return x[: 1 if same[0] else None, : 1 if same[1] else None]


def _same(x: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Whether every value of ``x`` equals ``first`` broadcast (NaN equal to NaN), as a 0-d bool tensor."""
    return ((x == first) | (x.isnan() & first.isnan())).all()


def _put(held: torch.Tensor | None, block: torch.Tensor, r0: int, q_len: int) -> torch.Tensor:
    """``block`` (1 or B, 1 or H, rows, K) written at query rows ``r0 ..`` of ``held`` (1 or B, 1 or H, Tq, K), made
    on the first block as narrow as it is, and widened (the rows before repeated) where a later one is wider."""
    want = (*(max(a, b) for a, b in zip(block.shape[:2], held.shape[:2] if held is not None else (1, 1),
                                        strict=True)), q_len, block.shape[-1])  # fmt: skip
    if held is None:
        held = block.new_empty(want)
    elif tuple(held.shape) != want:
        held = held.expand(want).clone()
    held[:, :, r0 : r0 + block.shape[-2]] = block
    return held


class _Forms:
    """A bias the same for every sample, block of rows by block of rows, into the two smaller forms it may have: of
    the key alone and of j - i alone (:class:`~biasviz.tracing.calls.CompactBias`), each entry's largest and smallest
    value over the attended cells that show it; a form holds where the two agree on every entry shown. O(H·T)."""

    def __init__(self, q_len: int, k_len: int) -> None:
        self.q_len, self.k_len = q_len, k_len
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # form -> (largest, smallest), (1, 1 or H, L)

    def add(self, r0: int, offset: torch.Tensor, kept: torch.Tensor) -> None:
        """Rows ``r0 ..`` of the bias ``offset`` (1, 1 or H, rows, Tk) over the cells ``kept`` (1 or B, 1 or H, rows,
        Tk) attended (by any sample)."""
        rows = offset.shape[-2]
        shown = kept.any(0, keepdim=True)
        high = torch.where(shown, offset, float("-inf"))  # (1, 1 or H, rows, Tk)
        low = torch.where(shown, offset, float("inf"))
        at = offsets(r0, r0 + rows, self.k_len, self.q_len, offset.device).flatten().expand(*high.shape[:2], -1)
        width = self.q_len + self.k_len - 1
        for form, hi, lo in (("key", high.amax(-2), low.amin(-2)),
                             ("offset", high.new_full((*high.shape[:2], width), float("-inf")).scatter_reduce(
                                 -1, at, high.flatten(-2), "amax"),
                              low.new_full((*low.shape[:2], width), float("inf")).scatter_reduce(
                                  -1, at, low.flatten(-2), "amin"))):  # fmt: skip
            held = self.tables.get(form)
            if held is not None:
                hi, lo = torch.maximum(held[0], hi), torch.minimum(held[1], lo)
            self.tables[form] = (hi, lo)

    def result(self) -> CompactBias | None | bool:
        """The first form that holds (the key's, then j - i's), NaN where no cell showed a value; False where the
        bias is 0 on every attended cell (no bias); None where neither form holds. One read."""
        checks = [((hi == lo) | hi.isinf()).all() for hi, lo in self.tables.values()]
        hi, lo = self.tables["key"]  # some attended cell holds a value other than 0: its largest or smallest
        checks.append((((hi != 0) & ~hi.isinf()) | ((lo != 0) & ~lo.isinf())).any())
        *holds, adds = torch.stack(checks).tolist()
        if not adds:
            return False
        for (form, (hi, _)), ok in zip(self.tables.items(), holds, strict=True):
            if ok:
                return CompactBias(form, hi.masked_fill(hi.isinf(), float("nan")), self.q_len)
        return None


def flex_operands(args: tuple[Any, ...], kwargs: dict[str, Any]) -> SdpaOperands | None:
    """A flex_attention call's operands as an SDPA call's: q, k, scale, the cells kept and score_mod's additive part
    (the bias); None where score_mod is not additive (softcapping), so rows formed again could not be its own.

    Evaluated a block of query rows at a time (:data:`KEEP_CELLS` cells, :func:`_flex`): what is kept is the grid's
    cells and the additive part, not the scores, score_mod's output and its probes of the whole grid (flex_attention
    itself forms none of them on a GPU); the cells with one sample's or head's values where they are the same for
    every one (a causal mask_mod: T² bits, not B·H·T²). A bias the same for every sample that is a function of the key
    alone or of j - i alone (ALiBi, T5's buckets as attention-gym writes them) is held in that form
    (:class:`~biasviz.tracing.calls.CompactBias`), never as H·T² floats; any other is evaluated again and held cell by
    cell."""
    bound = _flex_bound(args, kwargs)
    with torch.no_grad():
        held = _kept(bound, compact=True)
        return _kept(bound, compact=False) if held is _CELLS else held


_CELLS = object()  # what the compact pass of :func:`_kept` answers for a bias it cannot hold in a smaller form


def _kept(bound: dict[str, Any], compact: bool) -> SdpaOperands | None | object:
    """One pass over the call's blocks of rows (:func:`flex_operands`): its operands, None where score_mod is not
    additive, or (``compact``) :data:`_CELLS` where the bias differs by sample or has no smaller form."""
    batch, heads, q_len = bound["query"].shape[:3]
    k_len = bound["key"].shape[-2]
    rows = max(1, step_cells(bound["query"].device, KEEP_CELLS) // max(1, batch * heads * k_len))
    kept = offset = None
    forms = _Forms(q_len, k_len) if compact else None
    for r0 in range(0, q_len, rows):
        got = _flex(bound, r0, min(q_len, r0 + rows), scores=False)
        if not got.additive:
            return None
        kept = _put(kept, _narrowest(got.kept), r0, q_len)
        if got.offset is None:
            continue
        block = _narrowest(got.offset)
        if forms is None:
            offset = _put(offset, block, r0, q_len)
        elif block.shape[0] > 1:  # each sample's own bias: held cell by cell
            return _CELLS
        else:
            forms.add(r0, block, got.kept)
    assert kept is not None
    if forms is not None and forms.tables:
        found = forms.result()
        if found is None:
            return _CELLS
        return SdpaOperands(got.q, got.k, kept, None, got.scale, compact=found or None)  # (False: it adds none)
    whole = _Flex(got.q, got.k, got.scale, kept, None, None, offset, True)
    return SdpaOperands(got.q, got.k, kept, offset if whole.adds else None, got.scale)


def flex_call(index: int, args: tuple[Any, ...], kwargs: dict[str, Any], record: bool,
              inspect: bool = False, scores: bool = False) -> AttentionCall:  # fmt: skip
    """One call of the ``flex_attention`` operator: (q, k, v, score_mod, block_mask tuple, scale, ...).

    The bias is the additive part of ``score_mod``: ``score_mod(s, b, h, i, j) - s``, evaluated on the
    call's own scores; a score_mod whose output is not ``s`` plus a term free of ``s`` (softcapping,
    say) has no additive part, and the call is recorded with its weights and a note instead. ``inspect``
    checks that for a call that is not recorded (a probe), at the cost of forming its scores once.
    """
    bound = _flex_bound(args, kwargs)
    q, k = bound["query"], bound["key"]
    batch, heads, q_len = q.shape[:3]
    call = AttentionCall(index, "flex_attention", batch, heads, q_len, k.shape[-2])
    if not (record or inspect):  # its mask_mod and score_mod are not evaluated: only counted
        return call
    with torch.no_grad():
        got = _flex(bound)
        if got.offset is not None and got.adds and record:
            call.bias = got.offset.masked_fill(~got.kept, float("nan"))
        elif not got.additive:
            call.note = "score_mod is not additive (score_mod(s) - s changes with s: softcapping, say); " \
                        f"no bias recorded; {FORMED_BEFORE} scale·q·kᵀ before that step"  # fmt: skip
        call.causal = _is_causal(got.kept)
        call.adds_bias = got.adds
        call.forms_again = got.additive
        if record:
            assert got.formed is not None and got.before is not None  # (formed: scores=True)
            call.weights = _softmax_kept(got.formed, got.kept)
            if scores:  # a step that is not additive comes after the call's inputs: the scores before it
                call.scores = (got.formed if got.additive else got.before).masked_fill(~got.kept, float("nan"))
                call.keep_operands(q, k, got.scale)
    return call


# Scores at which a score_mod is checked to be additive besides the call's own: a softcap with a large cap
# is linear on small scores, and only scores of this size show that it is not s + b.
PROBES = (-1e6, -1e3, 1e3, 1e6)


def _additive(scores: torch.Tensor, modded: torch.Tensor, offset: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Whether score_mod(s) == s + score_mod(0) on the kept cells (to float32 rounding), a 0-d bool tensor (read by
    the caller with the others)."""
    expected = scores + offset
    tol = 1e-5 * (1.0 + expected.abs())
    close = ((modded - expected).abs() <= tol) | ~kept
    return close.all()
