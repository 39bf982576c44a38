"""What a streamed call attended, written on its blocks: none where its mask is its rule, the one mask (made once, the
same object on every block) while every sample has it, each sample's own from the first sample masked otherwise on;
torchrun's joined summaries refuse masks that differ. The expected cells are built here from the masks given."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.common.errors import BiasvizError
from biasviz.extraction.call_masks import CallMasks

T, H = 6, 2
CAUSAL = torch.ones(T, T, dtype=torch.bool).tril()
WINDOW = CAUSAL & ~torch.ones(T, T, dtype=torch.bool).tril(-3)  # i - j < 3


def adapter(causal: bool = True) -> SimpleNamespace:
    return SimpleNamespace(layer_causal=lambda layer: causal)


def call(first: int, cells: torch.Tensor, r0: int = 0, r1: int = T) -> RowBlock:
    """Rows r0 .. r1 - 1 of one call for samples ``first ..``, its cells (B or 1, H, T, T) as its scores show them."""
    weights = torch.zeros(cells.shape[0], H, r1 - r0, T)
    return RowBlock(0, first, r0, weights, attended=cells)


def test_a_call_whose_mask_is_its_rule_brings_no_cells() -> None:
    masks = CallMasks(adapter())
    for first in (0, 2):
        block = call(first, CAUSAL.expand(2, H, T, T))
        masks.settle(block)
        assert block.attended is None and block.mask is None and not block.by_sample
    bidirectional = CallMasks(adapter(causal=False))
    block = call(0, torch.ones(2, H, T, T, dtype=torch.bool))
    bidirectional.settle(block)
    assert block.attended is None


def test_one_mask_goes_with_every_block_as_one_object() -> None:
    masks = CallMasks(adapter())
    blocks = [call(0, WINDOW.expand(2, H, T, T)), call(2, WINDOW.expand(3, H, T, T), r0=2, r1=5)]
    for block in blocks:
        masks.settle(block)
    assert blocks[0].mask is blocks[1].mask and torch.equal(blocks[0].mask.mask[0], WINDOW)
    assert torch.equal(blocks[1].attended, WINDOW[2:5].expand(1, H, 3, T))  # the block's rows of it, for every sample
    assert not any(b.by_sample for b in blocks)


def test_samples_masked_otherwise_bring_their_own_cells_from_then_on() -> None:
    masks = CallMasks(adapter())
    padded = WINDOW.clone()
    padded[:, :2] = False  # the second batch's first sample: two pad keys
    first = call(0, WINDOW.expand(2, H, T, T))
    masks.settle(first)
    own = torch.stack([padded, WINDOW])[:, None].expand(2, H, T, T)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        later = call(2, own, r0=1, r1=4)
        masks.settle(later)
    assert any("samples masked differently" in str(w.message) for w in caught)
    assert later.by_sample and later.mask is None and torch.equal(later.attended, own[..., 1:4, :])
    again = call(4, WINDOW.expand(1, H, T, T))  # the one mask again: still each sample's own, as said
    masks.settle(again)
    assert again.by_sample and torch.equal(again.attended, WINDOW.expand(1, H, T, T))


def test_samples_of_one_batch_masked_differently() -> None:
    masks = CallMasks(adapter())
    own = torch.stack([CAUSAL, WINDOW])[:, None].expand(2, H, T, T)
    block = call(0, own)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        masks.settle(block)
    assert block.by_sample and torch.equal(block.attended, own)


def test_torchrun_refuses_masks_that_differ_by_sample() -> None:
    masks = CallMasks(adapter(), merged=True)
    masks.settle(call(0, WINDOW.expand(2, H, T, T)))
    with pytest.raises(BiasvizError, match="under torchrun a summary takes one mask for every sample"):
        masks.settle(call(2, CAUSAL.expand(2, H, T, T)))


def test_a_whole_call_sent_as_formed_attends_where_its_scores_are_numbers_and_weighs_nothing_elsewhere() -> None:
    """A whole call's block as a transformers model formed it: eager softmax gives a query with no key left (a padded
    row) uniform weights; the summaries count none of its cells and take its weights as 0 there."""
    padded = CAUSAL.expand(2, H, T, T).clone()
    padded[1, :, :2] = False  # sample 1's first two queries see no key (left padding)
    scores = torch.randn(2, H, T, T, dtype=torch.float64).masked_fill(~padded, float("nan"))
    weights = torch.rand(2, H, T, T, dtype=torch.float64)
    block = RowBlock(0, 0, 0, weights.clone(), scores=scores, marked=scores)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the note that samples are masked differently
        CallMasks(adapter()).settle(block)
    assert block.marked is None and block.by_sample
    assert torch.equal(block.attended, padded)
    assert torch.equal(block.weights, torch.where(padded, weights, 0.0))
    assert block.scores is scores  # the scores keep their NaN: that is how they show the mask


class Widened:
    """A layer's sums that record how they were widened."""

    def __init__(self) -> None:
        self.widened: list[tuple[int, ...]] = []

    def widen(self, *start: int) -> None:
        self.widened.append(start)


def test_a_call_that_turns_widens_its_layer_s_sums_only_and_is_said() -> None:
    """From a later batch: each sum of the turned layer widens (its position sums from that sample), no other layer's,
    and its samples count each their own cells from there; said once, with the samples before keeping their cells."""
    from biasviz.extraction.call_masks import BY_SAMPLE, widen

    masks = CallMasks(adapter())
    parts = {(kind, layer): Widened() for kind in ("weights", "scores") for layer in (0, 1)}
    position = {0: Widened(), 1: Widened()}
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        widen(1, 4, masks, parts, position, renew=None)
    assert [parts[kind, 1].widened for kind in ("weights", "scores")] == [[()], [()]]
    assert parts["weights", 0].widened == [] and position[0].widened == [] and position[1].widened == [(4,)]
    assert masks.known == {1: BY_SAMPLE}
    assert [str(w.message) for w in said] == [
        "attention call 1 attended keys after a query for sample 4 or one of its batch, though the first sample's "
        "attended none (a prefix seen both ways, or a padded query that the model's mask gives every key, say): its "
        "cells are taken as a call's that sees every key, within its own mask; the summary goes on, the samples before "
        "sample 4 keeping the cells they attended"]  # fmt: skip


def test_in_the_first_batch_the_sums_are_made_again_and_under_torchrun_refused() -> None:
    from biasviz.extraction.call_masks import widen

    parts, position = {("weights", 0): Widened()}, {0: Widened()}
    renewed: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        widen(0, 0, CallMasks(adapter()), parts, position, renew=renewed.append)
    assert renewed == [0] and parts["weights", 0].widened == [] and position[0].widened == []
    with pytest.raises(BiasvizError, match="under torchrun a summary cannot take it part-way: run it in one process"):
        widen(0, 2, CallMasks(adapter(), merged=True), parts, position, renew=None)
    assert parts["weights", 0].widened == []


def test_a_known_call_is_read_from_the_device_once_a_batch() -> None:
    """Each read of a tensor's value on the host waits for a GPU: once a call's cells are known, a later batch's are
    compared with them in one read, whether they are the call's rule or its one mask (and still one where they turn
    out to differ)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests.summaries.test_replay_dispatch import HOST_READS

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            Reads.count += str(func.overloadpacket.__name__ + "." + func._overloadname) in HOST_READS
            return func(*args, **(kwargs or {}))

    for cells, later in ((CAUSAL, CAUSAL), (WINDOW, WINDOW), (WINDOW, CAUSAL)):
        masks = CallMasks(adapter())
        masks.settle(call(0, cells.expand(2, H, T, T)))
        Reads.count = 0
        with Reads(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            masks.settle(call(2, later.expand(2, H, T, T)))
        assert Reads.count == 1, (cells, later)
