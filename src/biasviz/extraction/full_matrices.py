"""A full file's matrices: every block a forward sends laid together into each layer's whole (B, H, T, T) matrices.

An adapter has one way out of a forward, :meth:`~biasviz.adapters.base.ModelAdapter.stream`, which sends
:class:`~biasviz.adapters.rows.RowBlock` s. A summary reduces each as it comes; a full file (docs/hdf5.md) stores every
cell, so here the blocks of one forward are laid together, where the model computed them (on the GPU, say), for the
writer to move to the file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.adapters.rows import RowBlock


@dataclass
class FullMatrices:
    """Each layer's whole matrices of one forward, laid together from the blocks :meth:`ModelAdapter.stream` sends
    (:func:`full_matrices`): bias (1 or B, H, T, T), weights (B, H, T, T), what a full file stores.

    They stay where the model computed them (on the GPU, say); extraction moves them to the file. A block that is a
    call's whole matrix is kept as it is; blocks of rows go into one tensor per layer, started by each forward's first
    block (row 0: the caller may still hold the last ones), NaN in the bias and scores and 0 in the weights where no
    block formed a cell (j > i).
    """

    bias: dict[int, torch.Tensor] = field(default_factory=dict)
    weights: dict[int, torch.Tensor] = field(default_factory=dict)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)  # (B, H, T, T), when asked (docs/positional.md)
    # with the scores, where the adapter knows them: the call's q and k (B, H, T, hd), k multiplied by the call's
    # scale c, and c
    operands: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = field(default_factory=dict)
    # where a call came whole: its scores (or bias), NaN or -inf exactly where it masked (RowBlock.marked)
    marked: dict[int, torch.Tensor] = field(default_factory=dict)

    def clear(self) -> None:
        self.bias.clear()
        self.weights.clear()
        self.scores.clear()
        self.operands.clear()
        self.marked.clear()

    def of(self, kind: str) -> dict[int, torch.Tensor]:
        """The tensors of ``kind``: 'bias', 'weights' or 'scores'."""
        return {"bias": self.bias, "weights": self.weights, "scores": self.scores}[kind]

    def place(self, block: RowBlock) -> None:
        """Lay ``block``'s rows into its layer's matrices."""
        for kind in ("bias", "weights", "scores"):
            values = block.of(kind)
            if values is None:
                continue
            target, (rows, keys), length = self.of(kind), values.shape[-2:], block.length
            if block.r0 == 0 and (length is None or rows == keys == length):  # the whole matrix: kept as it is
                target[block.layer] = values
                continue
            assert length is not None, "a block of some of a call's rows says how many it has in all"
            if block.r0 == 0:
                fill = 0.0 if kind == "weights" else float("nan")
                target[block.layer] = torch.full((*values.shape[:2], length, length), fill, dtype=values.dtype,
                                                 device=values.device)  # fmt: skip
            target[block.layer][:, :, block.r0 : block.r0 + rows, :keys] = values
        if block.q is not None and block.k is not None and block.scale is not None:
            self.operands[block.layer] = (block.q, block.k, block.scale)
        if block.marked is not None:
            self.marked[block.layer] = block.marked


@contextlib.contextmanager
def full_matrices(adapter: ModelAdapter, layers: list[int], want_bias: bool = True,
                  want_scores: bool = False) -> Iterator[FullMatrices]:  # fmt: skip
    """Within the block, each :meth:`~ModelAdapter.forward` of ``adapter`` lays ``layers``' whole matrices into the
    result (the scores too with ``want_scores``, for adapters that :attr:`~ModelAdapter.captures_scores`): what a full
    file stores."""
    got = FullMatrices()
    with adapter.stream(layers, want_bias, got.place, want_scores and adapter.captures_scores):
        yield got
