"""Schemes that add no attention bias: GPT-2's learned absolute positions, and no positions at all."""

from __future__ import annotations

from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme


@register
class Learned(PositionScheme):
    """GPT-2's learned absolute position embeddings, added to the token embeddings."""

    name = "learned"


@register
class NoPE(PositionScheme):
    """No position information at all: only the causal mask tells tokens apart."""

    name = "nope"
