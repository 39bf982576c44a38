"""What the fused kernels read of a call's own mask (:mod:`biasviz.summaries.kernels.masks`): its bits, each tile's
class and each row's tenths of its keys, against numpy taken cell by cell. Plain torch: nothing here needs Triton."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.kernels import masks
from biasviz.summaries.kernels.masks import mask_operands, sample_operands
from tests.summaries.fused_reference import documents, padded, window


def _classes(cells: np.ndarray, tile: int) -> np.ndarray:
    """Each tile's class: 0 no cell attended, 1 every cell inside T attended, 2 some."""
    t = cells.shape[-1]
    tiles = -(-t // tile)
    out = np.zeros((tiles, tiles), dtype=np.int8)
    for a in range(tiles):
        for b in range(tiles):
            part = cells[a * tile : (a + 1) * tile, b * tile : (b + 1) * tile]
            out[a, b] = 0 if not part.any() else 1 if part.all() else 2
    return out


def _bounds(cells: np.ndarray) -> np.ndarray:
    """(T, 11): each row's first key of each tenth of its attended keys by rank (the k-th tenth starts at rank
    ceil(k n / 10) of the row's n keys), T for the end and for a row of fewer than 10 keys."""
    t = cells.shape[-1]
    out = np.full((t, 11), t, dtype=np.int64)
    for i in range(t):
        keys = np.flatnonzero(cells[i])
        if len(keys) >= 10:
            out[i, :10] = [keys[-(-k * len(keys) // 10)] for k in range(10)]
    return out


def _bits(cells: np.ndarray) -> np.ndarray:
    """Key 8m + b of a row in bit b of its byte m."""
    return np.packbits(cells, axis=-1, bitorder="little")


MASKS = [window(40, 7), window(64, 50), window(40, 20), documents(40, [0, 13, 30]), np.tril(np.ones((33, 33), bool)),
         np.tril(np.random.default_rng(0).random((45, 45)) < 0.6) | np.eye(45, dtype=bool)]  # fmt: skip


@pytest.mark.parametrize("cells", MASKS)
@pytest.mark.parametrize("tile", [16, 32])
def test_a_mask_s_bits_classes_and_tenths_are_its_cells(cells: np.ndarray, tile: int) -> None:
    got = mask_operands(torch.from_numpy(cells), tile)
    np.testing.assert_array_equal(got["cells"].numpy(), _bits(cells))
    assert got["width"] == -(-cells.shape[-1] // 8)
    np.testing.assert_array_equal(got["classes"].numpy(), _classes(cells, tile))
    np.testing.assert_array_equal(got["bounds"].numpy(), _bounds(cells))


def test_a_mask_s_tiles_are_classed_empty_full_or_partial() -> None:
    """Counted by hand: a window of 7 keys over tiles of 16; rows 48 .. 63 of a window of 50 see keys 14 .. 63."""
    assert mask_operands(torch.from_numpy(window(40, 7)), 16)["classes"].tolist() == [[2, 0, 0], [2, 2, 0], [0, 2, 2]]
    full = mask_operands(torch.from_numpy(window(64, 50)), 16)["classes"]
    assert full[3, 1] == 1 and full[3, 0] == 2 and full[0, 1] == 0
    bounds = mask_operands(torch.from_numpy(window(40, 20)), 16)["bounds"]
    assert bounds[5].tolist() == [40] * 11  # 6 keys: no tenths
    assert bounds[30].tolist() == [11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 40]  # keys 11 .. 30 by rank, 2 a tenth


def test_a_mask_worked_a_query_tile_at_a_time_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    cells = torch.from_numpy(documents(40, [0, 13, 30]))
    whole = mask_operands(cells, 16)
    monkeypatch.setattr(masks, "MASK_ROWS", 16)
    for name, value in mask_operands(cells, 16).items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(whole[name])), name


def test_a_mask_outside_the_causal_triangle_or_with_a_row_of_no_key_is_refused() -> None:
    with pytest.raises(ValueError, match="causal triangle"):
        mask_operands(torch.ones(8, 8, dtype=torch.bool), 16)
    empty_row = torch.tril(torch.ones(8, 8, dtype=torch.bool))
    empty_row[3] = False
    with pytest.raises(ValueError, match="every row seeing a key"):
        mask_operands(empty_row, 16)
    assert mask_operands(empty_row, 16, empty_rows=True)["bounds"][3].tolist() == [8] * 11


def test_each_sample_s_tiles_are_classed_and_any_sample_s_walked() -> None:
    cells = padded(40, [0, 19], [0, 0])
    got = sample_operands(torch.from_numpy(cells), 16)
    assert got["cells"].shape == (2, 40, 5) and got["bounds"].shape == (2, 40, 11)
    assert got["classes"][1].tolist() == [[0, 0, 0], [0, 2, 0], [0, 2, 2]]  # rows and keys 0 .. 18 padded
    assert got["classes"][0].tolist() == [[2, 0, 0], [1, 2, 0], [1, 1, 2]]
    assert got["classes"][2].tolist() == [[2, 0, 0], [1, 2, 0], [1, 2, 2]]  # the largest: a tile any sample attends
    for a in range(2):
        np.testing.assert_array_equal(got["cells"][a].numpy(), _bits(cells[a]))
        np.testing.assert_array_equal(got["bounds"][a].numpy(), _bounds(cells[a]))
