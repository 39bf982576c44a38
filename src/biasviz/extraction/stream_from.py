"""A summary whose rows were being formed again, turned to streaming part-way, with nothing run again.

Rows formed again take one scale (and softcap) for every sample, and a bias in a form they can hold
(:mod:`biasviz.adapters.kept_calls`). A call whose scale changes with the text, or whose bias differs cell by cell and
by sample, shows it only when a sample reaches it: the keeping forward raises
:class:`~biasviz.common.errors.MasksDifferBySample` at the batch that shows it. By then every sample before that batch
has kept what forms its rows, all of them under the first sample's scale and bias, compared exactly. So the summary
goes on streamed from that batch (:class:`StreamFrom`), and the samples before reach the same statistics as
:class:`~biasviz.adapters.rows.RowBlock` s formed again from the bank (:func:`formed_before`), each one a whole call as
a streaming forward sends it: its cells, its q and k. Only the batch that showed the difference runs again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from biasviz.adapters.rows import RowBlock, plain_cells
from biasviz.common.errors import MasksDifferBySample


class StreamFrom(Exception):  # noqa: N818 (a turn of the run, not an error a user sees)
    """Raised out of a keeping forward at the batch starting at sample ``start``, which showed ``why``: ``bank`` holds
    what formed samples ``0 .. start - 1`` (the receiver closes it)."""

    def __init__(self, why: MasksDifferBySample, bank: Any, start: int) -> None:
        super().__init__(str(why))
        # (without the frames it was raised through: they hold the forward's tensors)
        self.why, self.bank, self.start = why.with_traceback(None), bank, start

    def kept(self) -> StreamFrom:
        """This turn, held while the summary streams: without the frames of the forward it left (their tensors)."""
        self.__context__ = self.__cause__ = None
        return self.with_traceback(None)

    def said(self) -> str:
        """What the user is told: why, and that nothing but the batch that showed it runs again."""
        if not self.start:
            return f"{self.why}; the summary is streamed as the model forms its rows, from the first sample"
        before = ("the sample before it formed again from what its forward kept" if self.start == 1
                  else f"the {self.start} samples before it formed again from what their forwards kept")
        return (f"{self.why}; the summary goes on streamed as the model forms its rows from sample {self.start} on, "
                f"{before}")  # fmt: skip


def formed_before(adapter: Any, bank: Any, layers: list[int], sample: int, seq_len: int, *, want_bias: bool,
                  operands: bool) -> Iterator[RowBlock]:  # fmt: skip
    """Each of ``layers``' calls for ``sample`` of ``bank``, formed again whole (rows 0 .. T - 1) as a streaming forward
    sends it: its weights, scores and (``want_bias``) bias, the cells it attended (its rule's, its one mask or the
    sample's own), and with ``operands`` its q and k (k multiplied by the call's scale, key heads repeated)."""
    for layer in layers:
        block = adapter.rows_again(layer, bank, sample, 0, seq_len, want_bias)
        block.first = sample
        heads = block.weights.shape[1]
        cells = block.attended
        if cells is None:  # the call's one mask, or its rule: said on the block, as a streamed call's are
            mask = adapter.attended(layer)
            cells = mask if mask is not None else plain_cells(0, seq_len, block.keys, adapter.layer_causal(layer),
                                                              block.weights.device)  # fmt: skip
        # (1, H, T, K), each head's, as a streamed call's cells are read from its scores: the same mask compares equal
        block.attended = cells.to(block.weights.device).expand(1, heads, -1, -1)
        if operands:
            scale = adapter.score_scale(layer)
            q, k = (bank.get(layer, name, sample, 0, seq_len).view(1, seq_len, heads, -1).transpose(1, 2)
                    for name in ("q", "k"))  # fmt: skip
            # (a spilled bank's read is a view of one buffer: copied)
            block.q, block.k = q.to(block.weights.device, copy=True), (k * scale).to(block.weights.device)
            block.scale = scale
        yield block

