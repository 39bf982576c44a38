"""The one interface every positional scheme implements.

Dimension letters used in shape comments throughout biasviz:
``B`` batch, ``H`` heads, ``T`` sequence length, ``Tq``/``Tk`` query/key length, ``C`` model width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from biasviz.common.errors import BiasvizError


def relative_distance(q_len: int, k_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Distance d = i - j between query i and key j, as a (Tq, Tk) long tensor.

    Queries are the last ``q_len`` positions of the ``k_len`` keys (so i and j share one origin).

    >>> relative_distance(3, 3).tolist()
    [[0, -1, -2], [1, 0, -1], [2, 1, 0]]
    """
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return i - j  # (Tq, Tk)


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
