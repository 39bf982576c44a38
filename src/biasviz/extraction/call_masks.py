"""The cells each streamed attention call attends to, handed to the summaries of its layer (docs/hdf5.md, 'Attended
cells').

A call whose mask is the causal triangle (or, seeing every key, every cell) needs nothing; one mask for every
sample (sliding windows, local layers, flex block masks) is set once on every part of the layer
(:class:`~biasviz.summaries.attended.Attended`); masks that differ by sample (padding, packed documents) turn the
layer's per-cell summaries to per-sample counting from that sample on. Every block then brings the cells settled on
here, as few as say them: none where the mask is the call's rule, the one mask, or each batch's own; the statistics
read them from the block.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.common.errors import BiasvizError
from biasviz.summaries import QuantitySummary
from biasviz.summaries.attended import Attended, plain_mask
from biasviz.summaries.sample_cells import BY_SAMPLE_NOTE
from biasviz.summaries.streamed_position import StreamedPosition

Parts = dict[tuple[str, int], QuantitySummary]

BY_SAMPLE = "by sample"  # a layer whose samples are masked differently (its entry in ``masks``)


def attend(adapter: ModelAdapter, layer: int, kept: torch.Tensor, masks: dict[int, Any], parts: Parts,
            position: Mapping[int, StreamedPosition], first: int,
            merged: bool = False) -> torch.Tensor | None:  # fmt: skip
    """A streamed call's attended cells (B or 1, H, T, T): where they are not the causal triangle (or, in a call that
    sees every key, every cell), every summary of the layer is taken over them (docs/hdf5.md, 'Attended cells'). One
    mask while every sample has the same; from the first sample masked otherwise (padding, packed documents) on, each
    sample's own cells count for it (:meth:`QuantitySummary.by_sample`, :meth:`StreamedPosition.by_sample`).

    Returns the cells the call's blocks bring to what takes them from the block (the reducers): None where the call's
    mask is its rule, the one mask (1, 1 or H, T, T) while every sample has it, else the batch's own."""
    own = [part for (_, at), part in parts.items() if at == layer]
    spot = position.get(layer)
    if masks.get(layer) is BY_SAMPLE:
        return kept
    mask = kept[:1]
    differs = kept.shape[0] > 1 and not bool((kept == mask).all())
    causal = adapter.layer_causal(layer)
    if layer in masks and not differs:
        known = masks[layer]
        if bool(_plain(mask, causal)) if known is None else bool(torch.equal(known, mask)):
            return known
        differs = True
    if differs:
        if merged:
            raise BiasvizError(f"attention call {layer} masked other cells for sample {first} than for the first: "
                               "under torchrun a summary takes one mask for every sample; run it in one "
                               "process")  # fmt: skip
        warnings.warn(f"attention call {layer}: {BY_SAMPLE_NOTE}", stacklevel=2)
        masks[layer] = BY_SAMPLE
        for part in own:  # (the samples before attended the one mask set on them, or the call's rule)
            part.by_sample()
        if spot is not None:
            spot.by_sample(first)
        return kept
    if _plain(mask, causal):
        masks[layer] = None
        return None
    masks[layer] = mask
    attended = Attended(mask.to(kept.device))
    for part in own:
        part.attend(attended)
    if spot is not None:
        spot.attend(attended)
    return mask


def _plain(mask: torch.Tensor, causal: bool) -> bool:
    """Whether ``mask`` (1, H, T, T) is the causal triangle (``causal``) or every cell: no mask of the call's own."""
    return bool((mask == plain_mask(mask.shape[-1], causal, mask.device)).all())
