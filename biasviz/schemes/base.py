"""The one interface every positional scheme implements.

Dimension letters used in shape comments throughout biasviz:
``B`` batch, ``H`` heads, ``T`` sequence length, ``Tq``/``Tk`` query/key length, ``C`` model width.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn


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
        unknown = set(options) - set(self.default_options)
        if unknown:
            from biasviz.errors import BiasvizError

            raise BiasvizError(
                f"unknown option(s) {sorted(unknown)} for scheme '{self.name}'; "
                f"valid: {sorted(self.default_options) or 'none'}"
            )
        self.n_head = n_head
        self.d_model = d_model
        self.options = {**self.default_options, **options}

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
