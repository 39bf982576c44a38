"""How a page's size budget becomes detail: every head at full resolution first, exact values after.

The enlarged head is drawn from the finest level the page holds. A level of k x k block means draws as
"stairs", blocks of equal cells that read as structure the model does not have. So the budget is given out in
two passes over the sets, in the order :meth:`~biasviz.explorer.build._Builder._detail_groups` gives (the step
and the sample the page opens on, then the mean, then the others):

1. each head its full matrix: 16-bit codes (65,535 levels over the head's range, finer than any colour map; the
   read-out says within half a step), or the float32 values where they pack smaller (a bias that depends on
   i - j alone); only a head whose full matrix does not fit its share gets the finest block means that do;
2. with what is left, heads held in 16 bits become exact (float32), in the same order.

Within a set, heads share what is left equally when its turn comes, and what one does not use passes on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from biasviz.explorer.encode import Packed, pack_exact, pack_quantised

#: (checkpoint, layer, kind, sample) and the (label, file) pairs holding it: one group of heads.
Group = tuple[tuple[Any, ...], Sequence[tuple[str, Any]]]
#: The heads' matrices of one file for one group, in head order.
Matrices = Callable[[Any, Any, int, str, Any], Iterator[np.ndarray]]


def give_detail(sets: dict[str, Any], groups: Sequence[Group], key: Callable[..., str], matrices: Matrices,
                reduce: Callable[[np.ndarray, int], np.ndarray], block: int, left: float) -> float:  # fmt: skip
    """Add detail levels in front of each head's overview in ``sets`` (module docstring); returns what is left."""
    for group, members in groups:
        left = _full_resolution(sets, group, members, key, matrices, reduce, block, left)
    for group, members in groups:
        if left <= 0:
            break
        left = _exactness(sets, group, members, key, matrices, block, left)
    return left


def _full_resolution(sets: dict[str, Any], group: tuple[Any, ...], members: Sequence[tuple[str, Any]],
                     key: Callable[..., str], matrices: Matrices, reduce: Callable[[np.ndarray, int], np.ndarray],
                     block: int, left: float) -> float:  # fmt: skip
    """The first pass for one group, head by head and file by file (A's head h, then B's)."""
    levels = {label: [h["levels"] for h in sets[key(label, *group)]["heads"]] for label, _ in members}
    streams = [matrices(f, *group) for _, f in members]
    waiting = sum(len(v) for v in levels.values())
    for h, mats in enumerate(zip(*streams, strict=True)):
        for (label, _), m in zip(members, mats, strict=True):
            lv = levels[label][h]
            detail = _finest(m, lv[-1]["f"] // block, block, left / waiting, reduce)
            waiting -= 1
            left -= sum(p.nbytes for p in detail)
            lv[:0] = [p.as_json() for p in detail]
    return left


def _finest(m: np.ndarray, top: int, block: int, share: float,
            reduce: Callable[[np.ndarray, int], np.ndarray]) -> list[Packed]:  # fmt: skip
    """The full matrix (the smaller of 16-bit and exact) if it fits ``share`` bytes, else the finest block means
    that do; nothing when the overview (``top`` cells of ``m`` a block) is as fine as it gets."""
    if top == 1:  # the overview is the full matrix in 16 bits already
        return []
    exact = replace(pack_exact(m), factor=block)
    coded = pack_quantised(m, block)
    full = exact if exact.nbytes <= coded.nbytes else coded
    if full.nbytes <= share:
        return [full]
    factor = 2
    while factor < top:
        level = pack_quantised(reduce(m, factor), factor * block)
        if level.nbytes <= share:
            return [level]
        factor *= 2
    return []


def _exactness(sets: dict[str, Any], group: tuple[Any, ...], members: Sequence[tuple[str, Any]],
               key: Callable[..., str], matrices: Matrices, block: int, left: float) -> float:  # fmt: skip
    """The second pass for one group: a head held in 16 bits at full resolution becomes exact where it fits."""
    levels = {label: [h["levels"] for h in sets[key(label, *group)]["heads"]] for label, _ in members}
    waiting = sum(_coded(lv, block) for heads in levels.values() for lv in heads)
    if not waiting:
        return left  # nothing to make exact: the file is not read again
    streams = [matrices(f, *group) for _, f in members]
    for h, mats in enumerate(zip(*streams, strict=True)):
        for (label, _), m in zip(members, mats, strict=True):
            lv = levels[label][h]
            if not _coded(lv, block):
                continue
            exact = replace(pack_exact(m), factor=block).as_json()
            kept = len(lv) > 1  # a detail level to replace; else the overview itself is the 16-bit matrix
            cost = len(exact["data"]) - (len(lv[0]["data"]) if kept else 0)
            if cost <= left / waiting:
                lv[:1 if kept else 0] = [exact]
                left -= cost
            waiting -= 1
    return left


def _coded(levels: list[dict[str, Any]], block: int) -> bool:
    """Whether a head's finest level is its full matrix in 16-bit codes (a candidate to become exact)."""
    return bool(levels) and levels[0]["enc"] == "q16" and levels[0]["f"] == block


def precision_counts(sets: dict[str, Any], block: int) -> dict[str, int]:
    """Heads by the finest level the page holds for them, in the words of the page's footer."""
    counts: dict[str, int] = {}
    for s in sets.values():
        for head in s["heads"]:
            levels = head["levels"]
            if not levels:  # A - B: the page derives it from A's and B's levels
                continue
            finest, only = levels[0], " (overview only)" if len(levels) == 1 else ""
            if finest["enc"] == "f32":
                what = "exact (float32)"
            elif finest["f"] == block:
                what = ("full resolution, 16-bit" if block == 1 else "stored blocks, 16-bit") + only
            else:
                what = f"{finest['f']}x{finest['f']} block means, 16-bit{only}"
            counts[what] = counts.get(what, 0) + 1
    return counts


__all__ = ["give_detail", "precision_counts"]
