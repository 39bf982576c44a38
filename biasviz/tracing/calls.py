"""What one fused attention call computes, formed explicitly: its additive bias and post-softmax weights.

Fused kernels (``scaled_dot_product_attention``, ``flex_attention``) never form the (query, key)
matrix, so biasviz forms it again from the call's own arguments: the same q and k, scale, masks and
score_mod, in float32, with dropout off. Cells the call masks out (boolean masks, ``is_causal``,
-inf, or a large negative stand-in such as ``finfo.min`` or x-transformers' ``-finfo.max / 2``) are
NaN in the bias and 0 in the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# A float mask value at or below this counts as "masked", not as a bias: libraries write masked cells as
# finfo.min (transformers), -finfo.max / 2 (x-transformers) or -1e9; no positional bias comes near it.
MASKED_BELOW = -1e9
# float16 cannot hold -1e9: there a quarter of its range (finfo.min = -65504) marks a masked cell
MASKED_BELOW_HALF = torch.finfo(torch.float16).min / 4


@dataclass
class AttentionCall:
    """One intercepted call: its facts, and (for the calls asked for) what it computed.

    ``bias`` is (1 or B, H, Tq, Tk) float32, or None when the call adds nothing (no float mask, or a
    float mask that only masks); ``weights`` (B, H, Tq, Tk) float32. ``note`` says why a bias is missing
    where one might be expected (a ``score_mod`` that is not additive, say).
    """

    index: int
    kind: str  # "sdpa" or "flex_attention"
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


def _threshold(dtype: torch.dtype) -> float:
    return MASKED_BELOW_HALF if dtype == torch.float16 else MASKED_BELOW


def _as_bhqk(t: torch.Tensor) -> torch.Tensor:
    """(..., T, E) -> (B, H, T, E): a 3-D tensor has one head; extra leading dimensions fold into B."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    if t.dim() > 4:
        return t.reshape(-1, *t.shape[-3:])
    return t


def _mask_4d(mask: torch.Tensor) -> torch.Tensor:
    """A broadcastable mask as (1 or B, 1 or H, Tq, Tk)."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if mask.dim() > 4:
        mask = mask.reshape(-1, *mask.shape[-3:])
    return mask


def _softmax_kept(scores: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Softmax over keys of the kept cells; masked cells, and rows with nothing kept, are exactly 0."""
    scores = scores.masked_fill(~kept, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights.nan_to_num_(0.0)  # a row with every key masked: 0 everywhere, as flex_attention gives


def _repeat_kv(k: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention: key head g serves query heads g*G ... g*G + G - 1 (as SDPA's enable_gqa)."""
    if k.shape[1] == heads:
        return k
    if heads % k.shape[1]:
        raise ValueError(f"{heads} query heads cannot share {k.shape[1]} key heads")
    return k.repeat_interleave(heads // k.shape[1], dim=1)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q . k * scale in float32 (B, H, Tq, Tk); the default scale is 1/sqrt(E), as both kernels use."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return (q.float() @ _repeat_kv(k, q.shape[1]).float().transpose(-2, -1)) * scale


def _upper(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """The cells after their query, (Tq, Tk) True where j > i (top-left aligned, as ``is_causal`` is)."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu_(1)


def _is_causal(kept: torch.Tensor) -> bool:
    q_len, k_len = kept.shape[-2:]
    return not bool((kept & _upper(q_len, k_len, kept.device)).any())


def sdpa_call(index: int, args: tuple[Any, ...], kwargs: dict[str, Any], record: bool,
              inspect: bool = False) -> AttentionCall:  # fmt: skip
    """One ``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)`` call.

    Neither ``record`` nor ``inspect``: only its shape is read (a call before the one asked for).
    """
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args, strict=False)) | kwargs
    q, k = _as_bhqk(bound["query"]), _as_bhqk(bound["key"])
    mask, is_causal = bound.get("attn_mask"), bool(bound.get("is_causal", False))
    batch, heads, q_len = q.shape[:3]
    k_len = k.shape[-2]
    if not (record or inspect):
        return AttentionCall(index, "sdpa", batch, heads, q_len, k_len)
    kept = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=q.device)
    additive = None
    if is_causal:
        kept = kept & ~_upper(q_len, k_len, q.device)
    if mask is not None:
        mask = _mask_4d(mask)
        if mask.dtype == torch.bool:
            kept = kept & mask
        else:
            kept = kept & (mask > _threshold(mask.dtype))
            additive = mask
    if additive is not None and bool(additive.masked_fill(~kept, 0).eq(0).all()):
        additive = None  # a float mask of 0 and "masked" only: a mask, not a bias
    call = AttentionCall(index, "sdpa", batch, heads, q_len, k_len, causal=_is_causal(kept),
                         adds_bias=additive is not None)  # fmt: skip
    if not record:
        return call
    with torch.no_grad():
        scores = _scores(q, k, bound.get("scale"))
        if additive is not None:
            bias = additive.float().expand(-1, heads, q_len, k_len)
            call.bias = bias.masked_fill(~kept, float("nan"))
            scores = scores + bias
        call.weights = _softmax_kept(scores, kept)
    return call


# -- flex_attention --------------------------------------------------------------------------------------
def _on_grid(fn: Callable[..., torch.Tensor], shape: tuple[int, int, int, int], device: torch.device,
             score: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``fn`` (a score_mod or mask_mod, written for scalars) over every (b, h, q_idx, kv_idx), as flex's
    own eager path evaluates it: vmapped once per dimension."""
    idx = [torch.arange(n, device=device, dtype=torch.int32) for n in shape]
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


def flex_call(index: int, args: tuple[Any, ...], kwargs: dict[str, Any], record: bool,
              inspect: bool = False) -> AttentionCall:  # fmt: skip
    """One call of the ``flex_attention`` operator: (q, k, v, score_mod, block_mask tuple, scale, ...).

    The bias is the additive part of ``score_mod``: ``score_mod(s, b, h, i, j) - s``, evaluated on the
    call's own scores; a score_mod whose output is not ``s`` plus a term free of ``s`` (softcapping,
    say) has no additive part, and the call is recorded with its weights and a note instead. ``inspect``
    checks that for a call that is not recorded (a probe), at the cost of forming its scores once.
    """
    names = ("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
             "score_mod_other_buffers", "mask_mod_other_buffers")  # fmt: skip
    bound = dict(zip(names, args, strict=False)) | kwargs
    q, k = bound["query"], bound["key"]
    score_mod, block_mask = bound.get("score_mod"), bound.get("block_mask")
    batch, heads, q_len = q.shape[:3]
    k_len = k.shape[-2]
    shape = (batch, heads, q_len, k_len)
    if not (record or inspect):  # its mask_mod and score_mod are not evaluated: only counted
        return AttentionCall(index, "flex_attention", batch, heads, q_len, k_len)
    mask_mod = block_mask[-1] if isinstance(block_mask, tuple) and block_mask else None
    with torch.no_grad():
        if mask_mod is None:
            kept = torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=q.device)
        else:
            buffers = tuple(bound.get("mask_mod_other_buffers") or ())
            kept = _on_grid(lambda *a: mask_mod(*a, *buffers), shape, q.device).bool()
        identity = score_mod is None or getattr(score_mod, "__name__", "") == "_identity"
        call = AttentionCall(index, "flex_attention", batch, heads, q_len, k_len, causal=_is_causal(kept),
                             adds_bias=not identity)  # fmt: skip
        scores = _scores(q, k, bound.get("scale"))
        if not identity:
            buffers = tuple(bound.get("score_mod_other_buffers") or ())
            modded = _on_grid(lambda s, *a: score_mod(s, *a, *buffers), shape, q.device, score=scores).float()
            offset = _on_grid(lambda s, *a: score_mod(s, *a, *buffers), shape, q.device,
                              score=torch.zeros_like(scores)).float()  # fmt: skip
            if _additive(scores, modded, offset, kept):
                call.bias = offset.masked_fill(~kept, float("nan")) if record else None
            else:
                call.adds_bias = False
                call.note = "score_mod is not additive (its output is not the score plus a term free of it: " \
                            "softcapping, say); no bias recorded"  # fmt: skip
            scores = modded
        if record:
            call.weights = _softmax_kept(scores, kept)
    return call


def _additive(scores: torch.Tensor, modded: torch.Tensor, offset: torch.Tensor, kept: torch.Tensor) -> bool:
    """Whether score_mod(s) == s + score_mod(0) on the kept cells (to float32 rounding)."""
    expected = scores + offset
    tol = 1e-5 * (1.0 + expected.abs())
    close = ((modded - expected).abs() <= tol) | ~kept
    return bool(close.all())
