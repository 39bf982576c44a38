"""What one fused attention call computes, formed explicitly: its additive bias and post-softmax weights.

Fused kernels (``scaled_dot_product_attention``, ``flex_attention``) never form the (query, key)
matrix, so biasviz forms it again from the call's own arguments: the same q and k, scale, masks and
score_mod, in float32, with dropout off. Cells the call masks out (boolean masks, ``is_causal``,
-inf, or a large negative stand-in such as ``finfo.min`` or x-transformers' ``-finfo.max / 2``) are
NaN in the bias and 0 in the weights.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch

from biasviz.common.shapes import gpu_shaped

# A float mask value at or below this counts as "masked", not as a bias: libraries write masked cells as
# finfo.min (transformers), -finfo.max / 2 (x-transformers) or -1e9; no positional bias comes near it.
MASKED_BELOW = -1e9
# float16 cannot hold -1e9: there a quarter of its range (finfo.min = -65504) marks a masked cell
MASKED_BELOW_HALF = torch.finfo(torch.float16).min / 4
FORMED_BEFORE = "its scores and positional logits are"  # a note's words: formed from q and k, whatever came after


@dataclass
class AttentionCall:
    """One intercepted call: its facts, and (for the calls asked for) what it computed.

    ``bias`` is (1 or B, H, Tq, Tk) float32, or None when the call adds nothing (no float mask, or a
    float mask that only masks); ``weights`` (B, H, Tq, Tk) float32. ``note`` says why a bias is missing
    where one might be expected (a ``score_mod`` that is not additive, say).
    """

    index: int
    kind: str  # "sdpa", "flex_attention", "multi_head_attention" or "eager"
    batch: int
    heads: int
    q_len: int
    k_len: int
    # the two facts below are None for a call that was only counted (neither recorded nor inspected)
    causal: bool | None = None  # no key after its query takes part (j > i is masked everywhere)
    adds_bias: bool | None = None  # a float mask with values other than 0 and "masked", or an additive score_mod
    bias: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    note: str = ""
    sink: torch.Tensor | None = None  # (B, H, Tq): the softmax's share on attention-sink columns, if any
    scores: torch.Tensor | None = None  # (B, H, Tq, Tk) float32, the softmax's input, masked cells NaN, when asked
    # with the scores: the call's own q (B, H, Tq, E) and k (B, H, Tk, E, key heads repeated) in float32 and
    # scale c, scores = c·q·kᵀ + bias (docs/positional.md's positional logits are made from them)
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    scale: float | None = None
    forms_again: bool = False  # an eager call its q, k and terms form again (eager.eager_operands; SDPA calls: always)

    def keep_operands(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        self.q, self.k, self.scale = q.float(), repeat_kv(k, q.shape[1]).float(), float(scale)


def _threshold(dtype: torch.dtype) -> float:
    return MASKED_BELOW_HALF if dtype == torch.float16 else MASKED_BELOW


def _as_bhqk(t: torch.Tensor) -> torch.Tensor:
    """(..., T, E) -> (B, H, T, E): a 3-D tensor has one head; extra leading dimensions fold into B."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    if t.dim() > 4:
        return t.reshape(-1, *t.shape[-3:])
    return t


def _mask_4d(mask: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """A mask broadcastable against the query's (..., Tq, Tk) as (1 or B, 1 or H, Tq, Tk), matching ``_as_bhqk``.

    With a 3-D query (N, L, E) a 3-D mask is (N, L, S): its first dimension is the batch, not a head.
    """
    lead = tuple(query.shape[:-2])
    while mask.dim() < len(lead) + 2:
        mask = mask.unsqueeze(0)
    if len(lead) == 1:  # (N, L, E): one head
        return mask.unsqueeze(1)
    if mask.dim() > 4:
        mask = mask.expand(*lead, *mask.shape[-2:]).reshape(-1, lead[-1], *mask.shape[-2:])
    return mask


def _unpack_groups(q: torch.Tensor, mask: torch.Tensor | None, groups: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' packed GQA decoding: q as (B, KV heads, groups * Tq, E) back to (B, heads, Tq, E).

    Query head ``g * groups + r`` is row ``r`` of key head ``g`` in the packed call; a mask shared by all
    heads and rows stays as it is, one per row is unpacked the same way.
    """
    b, kv_heads, rows, e = q.shape
    q_len = rows // groups
    q = q.reshape(b, kv_heads, groups, q_len, e).reshape(b, kv_heads * groups, q_len, e)
    if mask is not None and mask.shape[-2] == rows and rows > 1:
        mb, mh = mask.shape[:2]
        mask = mask.expand(mb, kv_heads, rows, mask.shape[-1]).reshape(mb, kv_heads * groups, q_len, mask.shape[-1])
    return q, mask


def _softmax_kept(scores: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Softmax over keys of the kept cells; masked cells, and rows with nothing kept, are exactly 0 (as flex_attention
    gives). Only those rows: a NaN the model's own scores hold stays NaN (and is refused where it is stored). On a GPU
    the fill runs whatever the rows hold: to ask whether any is empty would wait for the device."""
    weights = torch.softmax(scores.masked_fill(~kept, float("-inf")), dim=-1)
    empty = ~kept.any(dim=-1, keepdim=True)  # a row with every key masked
    return weights.masked_fill_(empty, 0.0) if gpu_shaped(weights.device) or bool(empty.any()) else weights


def repeat_kv(k: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention: key head g serves query heads g*G ... g*G + G - 1 (as SDPA's enable_gqa)."""
    if k.shape[1] == heads:
        return k
    if heads % k.shape[1]:
        raise ValueError(f"{heads} query heads cannot share {k.shape[1]} key heads")
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q . k * scale in float32 (B, H, Tq, Tk); the default scale is 1/sqrt(E), as both kernels use."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return (q.float() @ repeat_kv(k, q.shape[1]).float().transpose(-2, -1)) * scale


def _upper(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """The cells after their query, (Tq, Tk) True where j > i (top-left aligned, as ``is_causal`` is)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu_(1)


def one_layout(bias: torch.Tensor) -> torch.Tensor:
    """(B, H, Tq, Tk) as (1, H, Tq, Tk) when every sample's bias is the same, masked cells included.

    A model's bias reaches the trace broadcast over the batch on one attention path (an SDPA mask of
    (1, H, T, T)) and expanded on another (eager code adding it to (B, H, T, T) scores): stored by what it
    holds, not by how it arrived, the same model gives one layout whatever its attention path.
    """
    if bias.shape[0] == 1:
        return bias
    first = bias[:1]
    same = (bias == first) | (bias.isnan() & first.isnan())
    return first if bool(same.all()) else bias


def _is_causal(kept: torch.Tensor) -> bool:
    q_len, k_len = kept.shape[-2:]
    return not bool((kept & _upper(q_len, k_len, kept.device)).any())


def offsets(r0: int, r1: int, keys: int, q_len: int, device: torch.device) -> torch.Tensor:
    """(rows, keys) int64: j - i + Tq - 1 for query rows r0 .. r1 - 1 and keys 0 .. ``keys`` - 1."""
    return torch.arange(keys, device=device)[None, :] - torch.arange(r0, r1, device=device)[:, None] + (q_len - 1)


@dataclass
class CompactBias:
    """A call's additive part held in a smaller form than its cells: ``form`` "key", a function of the key alone,
    ``values`` (1, 1 or H, Tk); "offset", of j - i alone, (1, 1 or H, Tq + Tk - 1) indexed by j - i + Tq - 1; "cells",
    (1, 1 or H, Tq, Tk). NaN where no attended cell showed a value."""

    form: str
    values: torch.Tensor
    q_len: int

    def rows(self, r0: int, r1: int, keys: int) -> torch.Tensor:
        """(1, 1 or H, rows, keys): the bias of query rows r0 .. r1 - 1 against keys 0 .. ``keys`` - 1, where attended
        (the other cells hold a value of the form, or NaN, which no statistic reads)."""
        if self.form == "key":
            return self.values[..., None, :keys].expand(*self.values.shape[:2], r1 - r0, keys)
        if self.form == "offset":  # row i is values[T - 1 - i + j], j < keys: windows of the table, last row first
            start = self.q_len - r1
            return self.values[..., start : self.q_len - r0 - 1 + keys].unfold(-1, keys, 1).flip(-2)
        return self.values[..., r0:r1, :keys]


@dataclass
class SdpaOperands:
    """What one SDPA call forms its attention from, in the model's own (batch, heads, queries, keys)."""

    q: torch.Tensor  # (B, H, Tq, E)
    k: torch.Tensor  # (B, H_kv, Tk, E): key heads are shared by groups of query heads where H_kv < H
    kept: torch.Tensor  # (1 or B, 1 or H, Tq, Tk) bool: the cells the call attends to
    additive: torch.Tensor | None  # (1 or B, 1 or H, Tq, Tk): a float mask that adds more than 0 and "masked"
    scale: float  # what q.k is multiplied by
    softcap: float | None = None  # c: the softmax takes c·tanh(s / c) of the scores s (an eager call's softcapping)
    # (B, H, Tq): where the softmax also runs over sink columns beside the keys (GPT-OSS), their logits' log-sum-exp for
    # each row, in the scale of the scores s: the denominator takes exp of it beside the keys' own
    sinks: torch.Tensor | None = None
    # the additive part in a smaller form, the same for every sample, where ``additive`` is None (a flex_attention
    # call's score_mod, never formed as (H, Tq, Tk) floats): :meth:`dense` forms it where a caller needs the cells
    compact: CompactBias | None = None

    @property
    def adds(self) -> bool:
        """Whether the call adds a bias (in either form)."""
        return self.additive is not None or self.compact is not None

    def dense(self) -> SdpaOperands:
        """These operands with the additive part as cells, (1, 1 or H, Tq, Tk)."""
        if self.compact is None:
            return self
        q_len, k_len = self.kept.shape[-2:]
        return replace(self, additive=self.compact.rows(0, q_len, k_len).contiguous(), compact=None)

    def facts(self, index: int) -> AttentionCall:
        """The call's facts (heads, lengths, causal, adds a bias), nothing formed."""
        batch, heads, q_len = self.q.shape[:3]
        return AttentionCall(index, "sdpa", batch, heads, q_len, self.k.shape[-2], causal=_is_causal(self.kept),
                             adds_bias=self.adds)  # fmt: skip


def _sdpa_bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    return dict(zip(names, args, strict=False)) | kwargs


def sdpa_operands(args: tuple[Any, ...], kwargs: dict[str, Any], groups: int = 1,
                  learned: bool = False) -> SdpaOperands:  # fmt: skip
    """The operands of ``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
    enable_gqa)``; ``groups`` > 1: q packs ``groups`` query heads per key head (transformers' GQA decoding).
    ``learned``: the float mask comes from the model's parameters, a bias even where it holds only zeros."""
    bound = _sdpa_bound(args, kwargs)
    q, k = _as_bhqk(bound["query"]), _as_bhqk(bound["key"])
    mask, is_causal = bound.get("attn_mask"), bool(bound.get("is_causal", False))
    if mask is not None and (type(mask) is not torch.Tensor and not isinstance(mask, torch.nn.Parameter)):
        mask = _dense_mask(mask, bound["query"])
    if mask is not None:
        mask = _mask_4d(mask, bound["query"])
    if groups > 1:
        q, mask = _unpack_groups(q, mask, groups)
    q_len, k_len = q.shape[-2], k.shape[-2]
    kept = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=q.device)
    additive = None
    if is_causal:
        kept = kept & ~_upper(q_len, k_len, q.device)
    if mask is not None:
        if mask.dtype == torch.bool:
            kept = kept & mask
        else:
            kept = kept & (mask > _threshold(mask.dtype))
            additive = mask
    if additive is not None and not learned and bool(additive.masked_fill(~kept, 0).eq(0).all()):
        additive = None  # a float mask of 0 and "masked" only: a mask, not a bias
    scale = bound.get("scale")
    return SdpaOperands(q, k, kept, additive, 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))


def _dense_mask(mask: Any, query: torch.Tensor) -> torch.Tensor:
    """torch's ``CausalBias`` (a tensor subclass standing for a mask): the (Tq, Tk) boolean mask SDPA applies for it;
    any other tensor subclass is read as a plain tensor."""
    materialize = getattr(mask, "_materialize", None)
    return (materialize(query.device) if materialize is not None else mask).as_subclass(torch.Tensor)


def sdpa_call(index: int, args: tuple[Any, ...], kwargs: dict[str, Any], record: bool,
              inspect: bool = False, groups: int = 1, scores: bool = False,
              learned: bool = False) -> AttentionCall:  # fmt: skip
    """One ``scaled_dot_product_attention`` call (:func:`sdpa_operands`), its bias and weights formed when
    ``record``.

    Neither ``record`` nor ``inspect``: only its shape is read (a call before the one asked for).
    The call is reported in the model's own (batch, heads, queries, keys), packed GQA heads unpacked;
    with ``scores`` its scores are kept too.
    """
    if not (record or inspect):
        bound = _sdpa_bound(args, kwargs)
        q, k = _as_bhqk(bound["query"]), _as_bhqk(bound["key"])
        if groups > 1:
            q, _ = _unpack_groups(q, None, groups)
        return AttentionCall(index, "sdpa", q.shape[0], q.shape[1], q.shape[2], k.shape[-2])
    ops = sdpa_operands(args, kwargs, groups, learned)
    call = ops.facts(index)
    if not record:
        return call
    with torch.no_grad():
        formed = formed_scores(ops)
        call.bias = None if ops.additive is None else one_layout(_bias(ops).masked_fill(~ops.kept, float("nan")))
        call.weights = _softmax_kept(formed, ops.kept)
        if scores:
            call.scores = formed.masked_fill(~ops.kept, float("nan"))
            call.keep_operands(ops.q, ops.k, ops.scale)
    return call


def _bias(ops: SdpaOperands) -> torch.Tensor:
    assert ops.additive is not None
    return ops.additive.float().expand(-1, ops.q.shape[1], *ops.kept.shape[-2:])


def formed_scores(ops: SdpaOperands) -> torch.Tensor:
    """The softmax's input: q.k * scale plus the additive mask, float32 (B, H, Tq, Tk), every cell (masked ones too)."""
    scores = _scores(ops.q, ops.k, ops.scale)
    return scores if ops.additive is None else scores + _bias(ops)


def formed_rows(q: torch.Tensor, k: torch.Tensor, scale: float, kept: torch.Tensor, bias: torch.Tensor | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and weights of queries (B, H, rows, E) against keys (B, H or fewer, keys, E), plus ``bias`` (float32;
    None: none), as :func:`sdpa_call` forms them; ``kept`` and ``bias`` broadcast to (B, H, rows, keys). ``softcap``
    c: the weights are the softmax of c·tanh(s / c), the scores s as the call's inputs give them (before that step).
    ``sinks`` (B, H, rows): each row's sink columns' log-sum-exp, in the denominator beside the keys (the keys' weights
    then sum to less than 1, as the model's do; a row with no key has weights 0)."""
    scores = _scores(q, k, scale) if bias is None else _scores(q, k, scale) + bias
    capped = scores if softcap is None else torch.tanh(scores / softcap) * softcap
    if sinks is None:
        return scores, _softmax_kept(capped, kept)
    z = capped.masked_fill(~kept, float("-inf"))
    sink = sinks[..., None].float()
    top = torch.maximum(z.amax(-1, keepdim=True), sink)
    top = top.masked_fill(top.isinf(), 0.0)  # a row with no key beside a sink of -inf: weights 0, not NaN
    e = torch.exp(z - top)
    # (the denominator is at least 1 where a row has a key or a finite sink: the clamp only keeps 0 / 0 from one with
    # neither)
    return scores, e / (e.sum(-1, keepdim=True) + torch.exp(sink - top)).clamp(min=torch.finfo(e.dtype).tiny)


def packed_groups(depth: int = 12) -> int:
    """Query heads packed per key head by the caller: transformers' ``sdpa_attention_forward`` decodes one
    token with grouped-query heads by reshaping q to (B, KV heads, groups, E) rather than repeating k and v.

    The call alone cannot tell that apart from ``groups`` queries of one head; the caller's frame can.
    """
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return 1
        if frame.f_code.co_name == "sdpa_attention_forward":
            local = frame.f_locals
            query, q_length = local.get("query"), local.get("q_length")
            groups = getattr(local.get("module"), "num_key_value_groups", 1)
            packed = isinstance(query, torch.Tensor) and query.dim() == 4 and query.shape[2] != q_length
            return int(groups) if packed and isinstance(groups, int) and groups > 1 else 1
        frame = frame.f_back
    return 1


def unformed(index: int, kind: str, args: tuple[Any, ...], kwargs: dict[str, Any], exc: Exception) -> AttentionCall:
    """A call whose attention could not be formed: its shape where it can be read, and why, in its note."""
    q = kwargs.get("query", args[0] if args else None)
    k = kwargs.get("key", args[1] if len(args) > 1 else None)
    shape = tuple(q.shape) if isinstance(q, torch.Tensor) else ()
    batch = shape[0] if len(shape) > 2 else 1
    heads = shape[-3] if len(shape) > 3 else 1
    q_len = shape[-2] if len(shape) > 1 else 0
    k_len = k.shape[-2] if isinstance(k, torch.Tensor) and k.dim() > 1 else 0
    if kind == "multi_head_attention":  # (L, N, E) or (L, E), heads named in the call
        batch, q_len = (shape[1] if len(shape) == 3 else 1), (shape[0] if shape else 0)
        k_len = k.shape[0] if isinstance(k, torch.Tensor) and k.dim() > 0 else 0
        heads = int(kwargs.get("num_heads", args[4] if len(args) > 4 else 1))
    note = f"not formed ({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); " \
           "the call ran unchanged"  # fmt: skip
    return AttentionCall(index, kind, batch, heads, q_len, k_len, note=note)
