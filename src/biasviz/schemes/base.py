"""The one interface every positional scheme implements.

Dimension letters used in shape comments throughout biasviz:
``B`` batch, ``H`` heads, ``T`` sequence length, ``Tq``/``Tk`` query/key length, ``C`` model width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from biasviz.common.errors import BiasvizError

RowsFn = Callable[[int, int], torch.Tensor]  # (r0, r1) -> bias of queries r0..r1-1 vs keys 0..r1-1


@dataclass(frozen=True)
class ScoreTerms:
    """A bias in a form a fused kernel reads cell by cell, without any (H, T, T) tensor: exactly one is set.

    ``distance`` (H, 2T - 1): b_h(i, j) is entry T - 1 - (i - j), the table :meth:`PositionScheme.rows` copies
    blocks from. ``ends`` (B, H, T): b_h(i, j) = ends[h, i] - ends[h, j] (a difference of cumulative sums).

    Beside a table, ``formula``: the same f_h(d) as arithmetic on a head's parameters, ``value(params, h, d)`` for
    d = i - j >= 0 cell by cell (:meth:`PositionScheme.score_formula`), which a compiled kernel evaluates in registers
    instead of reading the table at every cell; ``params`` are tensors, which the compiled kernel takes as inputs.
    """

    distance: torch.Tensor | None = None
    ends: torch.Tensor | None = None
    formula: tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None = None

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """The bias of queries r0..r1-1 against keys 0..r1-1: (1 or B, H, rows, r1), a new tensor."""
        if self.distance is not None:
            return toeplitz_rows(self.distance, (self.distance.shape[-1] + 1) // 2, r0, r1)
        return self.ends[:, :, r0:r1, None] - self.ends[:, :, None, :r1]


def relative_distance(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Distance d = i - j between query i and key j, as a (Tq, Tk) long tensor.

    Queries are the last ``q_len`` positions of the ``k_len`` keys (so i and j share one origin).

    >>> relative_distance(3, 3).tolist()
    [[0, -1, -2], [1, 0, -1], [2, 1, 0]]
    """
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return i - j  # (Tq, Tk)


def toeplitz_rows(table: torch.Tensor, seq_len: int, r0: int, r1: int) -> torch.Tensor:
    """The block f(i - j) for queries r0..r1-1 and keys 0..r1-1 from ``table`` (H, 2T - 1), whose entry m holds
    f(d = T - 1 - m): (1, H, rows, r1), a new contiguous tensor.

    Row a of the block reversed (a' = rows - 1 - a) starts at entry T - r1 + a' and runs on with the keys,
    so the reversed block is an overlapping strided view of the table; flipping its rows copies it once.

    >>> f = torch.arange(2, -3, -1.0)[None]  # T = 3: f(d) = d for d = 2 .. -2
    >>> toeplitz_rows(f, 3, 1, 3)[0, 0].tolist()  # rows 1, 2 against keys 0, 1, 2
    [[1.0, 0.0, -1.0], [2.0, 1.0, 0.0]]
    """
    rows = r1 - r0
    reversed_rows = table.as_strided(
        (table.shape[0], rows, r1),
        (table.stride(0), table.stride(1), table.stride(1)),
        table.storage_offset() + (seq_len - r1) * table.stride(1),
    )  # (H, rows, r1), rows in reverse order
    return reversed_rows.flip(1)[None]  # (1, H, rows, r1)


def query_positions(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Absolute 0-based position i of every query, as a (Tq, 1) long tensor."""
    return torch.arange(k_len - q_len, k_len, device=device)[:, None]


class PositionScheme(nn.Module):
    """Base class of every scheme: a module that returns the additive attention bias b_h(i, j).

    Subclasses set ``name`` and implement :meth:`bias`; :func:`biasviz.schemes.register` fills in the
    other class attributes below from the scheme's entry in ``biasviz.schemes.registry.TABLE``. Schemes
    that add no bias (``learned``, ``nope``) have ``adds_bias = False`` and are never called.
    """

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    formula: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    context_dependent: ClassVar[bool] = False
    adds_bias: ClassVar[bool] = True
    absolute_positions: ClassVar[bool] = False  # uses learned absolute embeddings (limits the length)
    rotary: ClassVar[bool] = False  # turns q and k by position (:meth:`rotate`) instead of adding a bias
    default_options: ClassVar[dict[str, Any]] = {}
    order: ClassVar[int] = 100  # position in listings (`biasviz schemes`, README)

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__()
        self.n_head = n_head
        self.d_model = d_model
        self.options = self.check_options(options, n_head)

    @classmethod
    def check_options(cls, options: Mapping[str, Any], n_head: int) -> dict[str, Any]:
        """The options with defaults filled in, or a :class:`BiasvizError` naming the first bad one.

        Called when a config is made (``train``, a checkpoint's config.json) as well as when the scheme is
        built, so a bad value is refused before any work; subclasses check their values in :meth:`_check`.
        """
        unknown = set(options) - set(cls.default_options)
        if unknown:
            raise BiasvizError(
                f"unknown option(s) {sorted(unknown)} for scheme '{cls.name}'; "
                f"valid: {sorted(cls.default_options) or 'none'}"
            )
        merged = {**cls.default_options, **options}
        cls._check(merged, n_head)
        return merged

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        """Check the values of ``options`` (all present); nothing to check by default."""

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        """Return b_h(i, j) as (1, H, Tq, Tk) — or (B, H, Tq, Tk) for context-dependent schemes.

        ``x`` is the attention input (after the layer norm), (B, Tk, C); context-independent
        schemes ignore it. Cells with j > i are not masked here: the attention layer masks them.
        """
        raise NotImplementedError

    def distance_bias(self, d: torch.Tensor) -> torch.Tensor | None:
        """b_h as a function of the distance ``d = i - j`` alone, (H, *d.shape); None where the bias depends
        on more (the query's position, the input). Such schemes compute :meth:`bias` through it, and
        :meth:`rows` reads every block off one table of the 2T - 1 distances."""
        return None

    def rows(self, x: torch.Tensor | None) -> RowsFn:
        """A function ``(r0, r1) -> bias`` of queries r0..r1-1 against keys 0..r1-1: (1 or B, H, r1 - r0, r1).

        The attention forms its bias one block of query rows at a time (a causal query block sees no
        key past its last row), so that no (H, T, T) tensor exists at long lengths. Each call returns a
        new tensor, which the caller may overwrite. The default calls :meth:`bias` on the prefix
        ``x[:, :r1]`` (queries are the last ``q_len`` of ``k_len`` positions, so the values are those of
        ``bias(x, T, T)[:, :, r0:r1, :r1]``); a scheme with :meth:`score_terms` forms every block from them,
        computed once per forward (a distance table: one pass, no formula per cell; CABLE's and FoX's
        cumulative sums over ``x``); schemes with other work per forward override it to do that work once.
        """
        terms = self.score_terms(x)
        if terms is not None:
            return terms.rows
        return lambda r0, r1: self.bias(None if x is None else x[:, :r1], r1 - r0, r1)

    def score_terms(self, x: torch.Tensor | None) -> ScoreTerms | None:
        """The bias of a whole forward over ``x`` (B, T, C) as :class:`ScoreTerms`, the values :meth:`rows` forms
        blocks of; None where it has no such form (then the attention forms blocks of rows). The default is the
        distance table of a scheme with a :meth:`distance_bias` (None without ``x``, which gives the length); a
        scheme whose bias needs the input raises a :class:`BiasvizError` without it."""
        if x is None:
            return None
        T = x.shape[1]
        table = self.distance_bias(torch.arange(T - 1, -T, -1, device=x.device))  # (H, 2T - 1): d = T-1 .. 1-T
        # contiguous: each block's rows are then runs of the table, a fast copy
        return None if table is None else ScoreTerms(distance=table.contiguous(), formula=self.score_formula())

    def score_formula(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]] | None:
        """The entries of :meth:`distance_bias` by the same arithmetic cell by cell, ``value(params, h, d)`` for
        integer tensors h (a head) and d = i - j >= 0, where the bias is arithmetic on a head's parameters (ALiBi,
        KERPLE); None where it is not (a table: T5's buckets, FIRE's network)."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, T, H, hd) as the scores take them: unchanged, except in rotary schemes (RoPE)."""
        return q, k

    @property
    def depends_on_input(self) -> bool:
        """Whether this instance's bias changes with the input (a scheme with options may differ from its flag)."""
        return self.context_dependent

    def forward(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        return self.bias(x, q_len, k_len)

    def reset_parameters(self) -> None:
        """Set the scheme's parameters to their initial values (called at model initialisation)."""

    @torch.no_grad()
    def constrain_(self) -> None:
        """Project learned parameters back into their valid range (called after optimiser steps)."""

    def extra_repr(self) -> str:
        return f"n_head={self.n_head}, options={self.options}"


def option_int(scheme: str, key: str, value: Any, minimum: int) -> int:
    """A scheme option that must be a whole number >= ``minimum`` (not a bool, not 2.5, not text)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BiasvizError(f"{scheme} option '{key}' must be an integer of at least {minimum}, not {value!r}")
    return value


def option_number(scheme: str, key: str, value: Any, *, positive: bool = False) -> float:
    """A scheme option that must be a finite number (and > 0 when ``positive``)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        want = "a positive number" if positive else "a finite number"
        raise BiasvizError(f"{scheme} option '{key}' must be {want}, not {value!r}")
    return float(value)
