"""What the fused kernels read of a call's own mask: its bits packed eight a byte, a class for each tile (as
FlexAttention's block mask has one), and each row's tenths of its attended keys; one mask for every sample, or each
sample's own."""

from __future__ import annotations

from typing import Any

import torch

from biasviz.store.datasets import SEGMENTS

MASK_ROWS = 1024  # rows of a mask worked into the kernels' operands at a time


def sample_operands(cells: Any, tile: int) -> dict:
    """:func:`mask_operands` of each sample's own mask (``cells`` (N, T, T) bool within the causal triangle, a row may
    see no key, or anything that gives sample a's (T, T) as ``cells[a]`` and N as ``len``: one unpacked at a time),
    stacked: ``cells`` (N, T, ceil(T / 8)), ``classes`` (N + 1, tiles, tiles) whose index N is the
    largest class over samples (a tile some sample attends: K2 walks it), ``bounds`` (N, T, 11)."""
    each = [mask_operands(cells[a], tile, empty_rows=True) for a in range(len(cells))]
    classes = torch.stack([got["classes"] for got in each])
    stacked = {name: torch.stack([got[name] for got in each]) for name in ("cells", "bounds")}
    return {**stacked, "classes": torch.cat([classes, classes.amax(0, keepdim=True)]).contiguous(),
            "width": each[0]["width"]}


def mask_operands(cells: torch.Tensor, tile: int, empty_rows: bool = False) -> dict:
    """What the kernels read of one (T, T) bool mask for every sample: its bits eight a byte (``cells``, (T,
    ceil(T / 8)) uint8, ``width`` bytes a row), each (query tile, key tile)'s class (``classes`` int8: 0 no cell
    attended, 1 every cell inside T, 2 some), and each row's tenths of its attended keys (``bounds`` (T, 11) int32:
    the first key of each tenth by rank, as the torch path's context mass takes them; T for rows of fewer than 10)."""
    from biasviz.summaries.bank import pack_cells

    seq_len = cells.shape[-1]
    if (cells.shape != (seq_len, seq_len) or bool(cells.triu(1).any())
            or not (empty_rows or bool(cells.any(-1).all()))):  # fmt: skip
        raise ValueError("the kernels take one (T, T) mask within the causal triangle, every row seeing a key")
    tiles = -(-seq_len // tile)
    pad = tiles * tile - seq_len
    classes = torch.empty(tiles, tiles, dtype=torch.int8, device=cells.device)
    bounds = torch.empty(seq_len, SEGMENTS + 1, dtype=torch.int32, device=cells.device)
    packed = torch.empty(seq_len, -(-seq_len // 8), dtype=torch.uint8, device=cells.device)
    step = max(tile, MASK_ROWS // tile * tile)  # whole query tiles a step: a few int32 copies of (step, T), not T²
    for r0 in range(0, seq_len, step):
        part = cells[r0 : r0 + step]
        rows = part.shape[0]
        padded = torch.nn.functional.pad(part, (0, pad, 0, -rows % tile))
        per_tile = padded.view(-1, tile, tiles, tile).sum((1, 3), dtype=torch.int32)
        inside = torch.zeros_like(padded, dtype=torch.int32)
        inside[:rows, :seq_len] = 1
        full = inside.view(-1, tile, tiles, tile).sum((1, 3), dtype=torch.int32)
        classes[r0 // tile : r0 // tile + per_tile.shape[0]] = torch.where(
            per_tile == 0, 0, torch.where(per_tile == full, 1, 2)).to(torch.int8)  # fmt: skip
        cums = part.cumsum(-1, dtype=torch.int32)
        seen = cums[:, -1:]
        need = -(-(torch.arange(SEGMENTS + 1, device=cells.device)[None] * seen) // SEGMENTS)  # a tenth's first rank
        at = torch.searchsorted(cums, (need + 1).to(torch.int32).contiguous())  # the key of that rank
        bounds[r0 : r0 + rows] = torch.where(seen >= SEGMENTS, at, seq_len).clamp(max=seq_len).to(torch.int32)
        packed[r0 : r0 + rows] = pack_cells(part)
    return {"cells": packed, "classes": classes, "bounds": bounds, "width": packed.shape[-1]}
