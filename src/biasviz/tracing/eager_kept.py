"""An eager softmax's operands as an SDPA call's (:func:`eager_operands`): what a summary's keeping forward keeps of
eager attention, so that its rows are formed again from q, k, the scale, the cells and the terms added (the bias), and
where the model softcapped or ran its softmax over sink columns beside the keys, the cap or each row's sink logits."""

from __future__ import annotations

import torch

from biasviz.tracing.calls import SdpaOperands, _threshold, repeat_kv
from biasviz.tracing.scores import Scores


def eager_operands(x: torch.Tensor, s: Scores, learned: bool = False) -> SdpaOperands | None:
    """What a softmax over eager scores ``x`` forms its weights from, as an SDPA call's operands, where scale·q·kᵀ plus
    the terms added, under a mask, is all the scores went through (or softcapping, c·tanh(s / c), of a plain scale·q·kᵀ:
    Gemma 2's; or sink columns beside the keys, GPT-OSS's, their logits kept for each row), and the model formed them
    in float32 (so that rows formed again from q and k are the model's own, to rounding); None where they cannot be
    formed again that way (another note, moved cells, a lower precision, q and k that cannot be followed, a softcap
    beside sink columns). ``learned``: a term made from the model's parameters is a bias even where it holds zeros."""
    folded = s.folded_heads(tuple(x.shape))  # (B·H, Tq, Tk) scores: the heads their own view on the way unfolds
    x4 = _bhqk(x, folded)
    start, stop = s.columns if s.columns is not None else (0, x4.shape[-1])
    keys = x4[..., start:stop]
    kept = keys > _threshold(x.dtype)
    capped = s.capped_at is not None and s.columns is None and _masks_only(s.bias(), kept, x.shape, folded)
    pair = s.q_and_k() if not s.moved and (not s.note or capped) else None
    if pair is None or x.dtype != torch.float32 or any(t.dtype != torch.float32 for t in pair):
        return None
    if pair[0].shape[:-1] != x.shape[:-1] or pair[1].shape[-2] != stop - start:
        return None
    q, k = _bhqk(pair[0], folded), _bhqk(pair[1], folded)
    if capped:  # the softcap c: the scale met at the tanh is scale / c (the factors cancel in s.scale)
        assert s.capped_at is not None
        return SdpaOperands(q, k, kept, None, float(s.scale), softcap=float(s.scale) / s.capped_at)
    added = s.bias()
    additive = None
    if added is not None:
        additive = _bhqk(added.expand(*x.shape[:-1], added.shape[-1]), folded)
        if additive.shape[-1] == x4.shape[-1]:  # added after a cat with sink columns: the keys' part
            additive = additive[..., start:stop]
        learned = learned or any(t.learned for t in s.terms)
        if not learned and not bool(additive.masked_fill(~kept, 0).ne(0).any()):
            additive = None  # the terms only mask
    ops = SdpaOperands(q, k, kept, additive, float(s.scale))
    if s.columns is not None:
        ops.sinks = _sink_logits(x4, start, stop, ops)
    return ops


def _sink_logits(x4: torch.Tensor, start: int, stop: int, ops: SdpaOperands) -> torch.Tensor:
    """(B, H, Tq) float32: each row's sink columns (``x4``'s outside ``start`` .. ``stop``) as one log-sum-exp, in
    the scale of the scores ops forms (scale·q·kᵀ + its bias): the model may have shifted its rows (GPT-OSS subtracts
    each row's largest logit), so the shift is read off the row's first attended key, its score formed from q and k
    against the value the softmax met. O(B·H·T·E): no (T, T) product."""
    keys = x4[..., start:stop].float()
    extra = torch.cat([x4[..., :start], x4[..., stop:]], -1).float()
    first = ops.kept.expand_as(keys).float().argmax(-1, keepdim=True)  # (B, H, Tq, 1): a row's first attended key
    k = repeat_kv(ops.k, ops.q.shape[1]).float()
    at = k.gather(2, first.expand(-1, -1, -1, k.shape[-1]))  # (B, H, Tq, E)
    formed = (ops.q.float() * at).sum(-1, keepdim=True) * ops.scale
    if ops.additive is not None:
        formed = formed + ops.additive.float().expand_as(keys).gather(-1, first)
    shift = torch.where(ops.kept.expand_as(keys).any(-1, keepdim=True), formed - keys.gather(-1, first), 0.0)
    return (torch.logsumexp(extra, -1, keepdim=True) + shift)[..., 0]


def _masks_only(added: torch.Tensor | None, kept: torch.Tensor, shape: torch.Size, heads: int = 1) -> bool:
    """Whether the terms added to scores of ``shape`` only mask: 0 on every attended cell (``kept``, as (B, H, Tq,
    Tk)), the rest masked away; ``heads`` folded into the batch of 3-D scores as :func:`_bhqk` takes them."""
    if added is None:
        return True
    b = _bhqk(added.expand(shape), heads)
    return b.shape == kept.shape and not bool(b.masked_fill(~kept, 0).ne(0).any())


def _bhqk(t: torch.Tensor, heads: int = 1) -> torch.Tensor:
    """(..., Tq, Tk) as (B, H, Tq, Tk): 2-D is one sample of one head, 3-D one head per sample, or ``heads`` heads
    folded into the batch (B·H, Tq, Tk) (:meth:`~biasviz.tracing.scores.Scores.folded_heads`)."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t.unsqueeze(1) if heads == 1 else t.reshape(t.shape[0] // heads, heads, *t.shape[1:])
    return t.reshape(-1, *t.shape[-3:]) if t.dim() > 4 else t
