"""The cells each streamed attention call attends to, settled on as its blocks come and written on them (docs/hdf5.md,
'Attended cells').

A call whose mask is the causal triangle (or, seeing every key, every cell) needs nothing; one mask for every
sample (sliding windows, local layers, flex block masks) goes with every block of the call as
:attr:`~biasviz.adapters.rows.RowBlock.mask` (:class:`~biasviz.summaries.attended.Attended`, made once: every summary of
the layer divides by the same counts); masks that differ by sample (padding, packed documents) mark every block of the
call from that sample on (:attr:`~biasviz.adapters.rows.RowBlock.by_sample`). A block's cells
(:attr:`~biasviz.adapters.rows.RowBlock.attended`) are then as few as say them: none where the mask is the call's rule,
its rows of the one mask, or of the batch's own. Every statistic reads what it needs from the block: nothing is set
on it from here. A call taken as causal that turns out to attend keys after a query widens its layer's sums
(:func:`widen`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.adapters.rows import RowBlock, plain_cells
from biasviz.common.errors import BiasvizError, past_query_said
from biasviz.summaries.attended import Attended
from biasviz.summaries.sample_cells import BY_SAMPLE_NOTE


@dataclass(frozen=True, eq=False)
class CallCells:
    """What one call attended in the samples seen so far: its rule (no mask of its own), one mask every sample had
    (``mask``, with its :class:`Attended` made once, so that every summary of the layer divides by the same counts), or
    each sample's own (``by_sample``, from the batch that showed it on, for good)."""

    mask: torch.Tensor | None = None  # (1, 1 or H, T, T) bool
    attended: Attended | None = None
    by_sample: bool = False


RULE = CallCells()  # the call's rule: the causal triangle, or every cell
BY_SAMPLE = CallCells(by_sample=True)


class CallMasks:
    """Per layer, what its call attended so far (:class:`CallCells`; a layer absent: none of its blocks showed it)."""

    def __init__(self, adapter: ModelAdapter, merged: bool = False) -> None:
        """``merged``: torchrun's processes join their summaries, which take one mask for every sample."""
        self.adapter, self.merged = adapter, merged
        self.known: dict[int, CallCells] = {}

    def settle(self, block: RowBlock) -> None:
        """Write on ``block`` (of samples ``block.first ..``, its ``attended`` the call's cells (B or 1, H, T, T), or
        its ``marked`` scores or bias showing them, or neither where nothing shows them) the cells its rows attend, the
        call's one mask and whether samples are masked differently; a whole call's weights are 0 where it masked."""
        if block.marked is not None:  # a whole call as formed: its cells are where its scores (or bias) are finite
            block.attended = torch.isfinite(block.marked)  # (B or 1, H, T, T) bool
            # a cell the call masks counts for nothing: a query row with no key left keeps eager code's uniform softmax
            block.weights = block.weights.masked_fill(~block.attended, 0.0)
            block.marked = None
        if block.attended is None:
            return
        cells = self._cells(block.layer, block.attended, block.first)
        known = self.known[block.layer]
        block.by_sample, block.mask = known.by_sample, known.attended
        block.attended = None if cells is None else cells[..., block.r0 : block.r1, : block.keys]

    def widen(self, layer: int) -> None:
        """``layer``'s call, causal so far, attends keys after a query from the batch under way on: the samples before
        attended the causal triangle (or the one mask they had), so from here on each sample's own cells count."""
        self.known[layer] = BY_SAMPLE

    def _cells(self, layer: int, kept: torch.Tensor, first: int) -> torch.Tensor | None:
        """The call's cells as few as say them: None where its mask is its rule, the one mask (1, 1 or H, T, T) while
        every sample has it, else the batch's own; settles :attr:`known` for the layer. Once the call is known, one read
        of the device a call: every sample of the batch against what the call attended so far."""
        known = self.known.get(layer)
        if known is not None and known.by_sample:
            return kept
        if known is not None:
            if known.mask is None:  # the rule: the causal triangle or every cell, whatever the heads
                same = _plain(kept, self.adapter.layer_causal(layer))
            else:  # the one mask, of as many heads
                same = known.mask.shape[1:] == kept.shape[1:] and bool((kept == known.mask).all())
            return known.mask if same else self._by_sample(layer, kept, first)
        mask = kept[:1]
        if kept.shape[0] > 1 and not bool((kept == mask).all()):
            return self._by_sample(layer, kept, first)
        if _plain(mask, self.adapter.layer_causal(layer)):
            self.known[layer] = RULE
            return None
        self.known[layer] = CallCells(mask, Attended(mask.to(kept.device)))
        return mask

    def _by_sample(self, layer: int, kept: torch.Tensor, first: int) -> torch.Tensor:
        """The batch of sample ``first`` showed samples masked differently: each one's own cells, from here on."""
        if self.merged:
            raise BiasvizError(f"attention call {layer} masked other cells for sample {first} than for the first: "
                               "under torchrun a summary takes one mask for every sample; run it in one "
                               "process")  # fmt: skip
        warnings.warn(f"attention call {layer}: {BY_SAMPLE_NOTE}", stacklevel=4)
        self.known[layer] = BY_SAMPLE
        return kept


def _plain(mask: torch.Tensor, causal: bool) -> bool:
    """Whether ``mask`` (B or 1, H, T, T), every sample of it, is the causal triangle (``causal``) or every cell: no
    mask of the call's own."""
    t = mask.shape[-1]
    return bool((mask == plain_cells(0, t, t, causal, mask.device)).all())


def widen(layer: int, start: int, masks: CallMasks, parts: Mapping[tuple[str, int], Any], position: Mapping[int, Any],
          renew: Callable[[int], None] | None) -> None:  # fmt: skip
    """``layer``'s call, summarised as causal, attends keys after a query from the batch of sample ``start`` on (its
    adapter now takes it as one that sees every key), before any block of that batch is taken: said. In the first batch
    ``renew`` makes its sums again for that rule; from a later one they widen (``widen()`` of each :class:`~biasviz.
    summaries.layer.QuantitySummary` of ``parts`` and of its :class:`~biasviz.summaries.streamed_position.
    StreamedPosition` in ``position``), the samples before keeping the cells they attended, as samples masked
    differently do. Nothing runs again. Under torchrun, whose processes join one mask, refused."""
    said = past_query_said(f"attention call {layer}", start)
    if masks.merged:
        raise BiasvizError(f"{said}; under torchrun a summary cannot take it part-way: run it in one process")
    if renew is not None:
        renew(layer)
        warnings.warn(f"{said}, from the first sample on", stacklevel=4)
        return
    masks.widen(layer)
    for (_, at), part in parts.items():
        if at == layer:
            part.widen()
    if layer in position:
        position[layer].widen(start)
    warnings.warn(f"{said}; the summary goes on, the samples before sample {start} keeping the cells they attended",
                  stacklevel=4)  # fmt: skip
