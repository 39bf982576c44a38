"""torch's own attention layers: ``nn.MultiheadAttention`` and the ``nn.Transformer*Layer`` built on it.

They call ``torch.nn.functional.multi_head_attention_forward``, whose inner SDPA (or explicit softmax) runs
out of sight of a function mode, so the trace sees the outer call. Its per-head weights are torch's own:
the same function again with ``need_weights=True, average_attn_weights=False`` and dropout off (the
model's call runs unchanged beside it). Its bias is the float ``attn_mask`` plus a float
``key_padding_mask``; boolean masks and cells at or below the masked threshold are masked (NaN in the bias).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from biasviz.tracing.calls import AttentionCall, SdpaOperands, _is_causal, _threshold, one_layout

MHA = F.multi_head_attention_forward
_SIGNATURE = inspect.signature(MHA)


def _float(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A mask as torch's layers add it: True (not allowed) is -inf, a float mask is added as it is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=like.dtype, device=mask.device).masked_fill(mask, float("-inf"))
    return mask


def _added(bound: dict[str, Any], batch: int, heads: int, q_len: int, k_len: int, like: torch.Tensor,
           unbatched: bool) -> torch.Tensor:  # fmt: skip
    """What the layer adds to the scaled q.k before the softmax, as (1 or N, 1 or H, L, S) float32."""
    total = torch.zeros(1, 1, q_len, k_len, device=like.device)
    attn_mask, padding = bound.get("attn_mask"), bound.get("key_padding_mask")
    if attn_mask is not None:
        m = _float(attn_mask, like).float()
        m = m[None, None] if m.dim() == 2 else m.reshape(batch, heads, *m.shape[-2:])
        total = total + F.pad(m, (0, k_len - m.shape[-1]))  # add_bias_kv / add_zero_attn: 0 on the extra key
    if padding is not None:
        p = _float(padding, like).float()
        p = p.reshape(1 if unbatched else batch, 1, 1, p.shape[-1])
        total = total + F.pad(p, (0, k_len - p.shape[-1]))
    return total


def _q_and_k(bound: dict[str, Any], heads: int, unbatched: bool) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The layer's q (N, H, L, hd) and k (N, H, S, hd) as its own in-projection makes them (float32), with
    ``bias_k`` and ``add_zero_attn``'s keys appended as the layer appends them, and the scale 1/√hd."""
    query, key = bound["query"], bound["key"]
    if unbatched:
        query, key = query.unsqueeze(1), key.unsqueeze(1)
    e = query.shape[-1]
    hd = e // heads
    if bound.get("use_separate_proj_weight"):
        w_q, w_k = bound["q_proj_weight"], bound["k_proj_weight"]
    else:
        w_q, w_k = bound["in_proj_weight"][:e], bound["in_proj_weight"][e : 2 * e]
    b = bound.get("in_proj_bias")
    b_q, b_k = (None, None) if b is None else (b[:e], b[e : 2 * e])
    q = F.linear(query.float(), w_q.float(), None if b_q is None else b_q.float())  # (L, N, E)
    static_k = bound.get("static_k")
    if static_k is not None:  # (N·H, S, hd), as given
        k = static_k.float().view(query.shape[1], heads, -1, hd)
    else:
        k = F.linear(key.float(), w_k.float(), None if b_k is None else b_k.float())  # (S, N, E)
        if bound.get("bias_k") is not None:
            k = torch.cat([k, bound["bias_k"].float().expand(1, k.shape[1], e)])
        k = k.view(k.shape[0], k.shape[1], heads, hd).permute(1, 2, 0, 3)
    if bound.get("add_zero_attn"):
        k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, hd)], dim=2)
    q = q.view(q.shape[0], q.shape[1], heads, hd).permute(1, 2, 0, 3)
    return q, k, 1.0 / math.sqrt(hd)


def _bound(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], int, bool, int, int, int]:
    """The call's arguments by name, its heads, whether unbatched, its batch and its query and key lengths."""
    bound = _SIGNATURE.bind(*args, **kwargs).arguments
    query, heads = bound["query"], int(bound["num_heads"])
    unbatched = query.dim() == 2
    batch, q_len = (1 if unbatched else query.shape[1]), query.shape[0]
    static_k = bound.get("static_k")
    k_len = static_k.shape[1] if static_k is not None else bound["key"].shape[0]
    k_len += int(bound.get("bias_k") is not None) + int(bool(bound.get("add_zero_attn")))
    return bound, heads, unbatched, batch, q_len, k_len


def _cells(bound: dict[str, Any], added: torch.Tensor,
           learned: Callable[[Any], bool] | None) -> tuple[torch.Tensor, bool]:  # fmt: skip
    """The cells the layer attends, and whether what it adds there is a bias (more than 0 and "masked", or a float
    mask made from the model's parameters)."""
    query = bound["query"]
    kept = added > _threshold(query.dtype if query.is_floating_point() else torch.float32)
    from_table = learned is not None and learned(bound.get("attn_mask"))
    return kept, from_table or bool(added.masked_fill(~kept, 0).ne(0).any())


def mha_operands(args: tuple[Any, ...], kwargs: dict[str, Any],
                 learned: Callable[[Any], bool] | None = None) -> SdpaOperands:  # fmt: skip
    """A ``multi_head_attention_forward`` call's operands as an SDPA call's: q and k from the layer's own in-projection
    (float32), its scale 1/√hd, the cells it attends and the float masks it adds (its bias)."""
    bound, heads, unbatched, batch, q_len, k_len = _bound(args, kwargs)
    with torch.no_grad():
        q, k, scale = _q_and_k(bound, heads, unbatched)
        added = _added(bound, batch, heads, q_len, k_len, bound["query"], unbatched)
        kept, adds = _cells(bound, added, learned)
    return SdpaOperands(q, k, kept, added if adds else None, scale)


def mha_call(index: int, args: tuple[Any, ...], kwargs: dict[str, Any], record: bool,
             inspect_only: bool = False, learned: Callable[[Any], bool] | None = None,
             scores: bool = False) -> AttentionCall:  # fmt: skip
    """One ``multi_head_attention_forward`` call (query as (L, N, E), or (L, E) unbatched).

    ``learned(t)``: whether a tensor comes from the model's parameters (a float mask that is a learned bias,
    recorded even where it holds only zeros)."""
    bound, heads, unbatched, batch, q_len, k_len = _bound(args, kwargs)
    query = bound["query"]
    call = AttentionCall(index, "multi_head_attention", batch, heads, q_len, k_len, forms_again=True)
    if not (record or inspect_only):
        return call
    with torch.no_grad():
        added = _added(bound, batch, heads, q_len, k_len, query, unbatched)
        kept, call.adds_bias = _cells(bound, added, learned)
        call.causal = _is_causal(kept)
        if call.adds_bias and record:
            call.bias = one_layout(added.masked_fill(~kept, float("nan")))
        if record:
            again = dict(bound, need_weights=True, average_attn_weights=False, training=False)
            weights = MHA(**again)[1].float()
            call.weights = weights[None] if unbatched else weights
        if record and scores:  # the softmax's input, from the layer's own projections; with its q and k
            q, k, scale = _q_and_k(bound, heads, unbatched)
            call.scores = (q @ k.transpose(-2, -1) * scale + added).masked_fill(~kept, float("nan"))
            call.keep_operands(q, k, scale)
    if record and bound.get("training", True) and float(bound.get("dropout_p", 0.0)):
        call.note = f"dropout_p={bound['dropout_p']} in training mode: weights recorded before dropout"
    return call
