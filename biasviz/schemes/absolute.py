"""Schemes that add no attention bias: GPT-2's learned absolute positions, and no positions at all."""

from __future__ import annotations

from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme


@register
class Learned(PositionScheme):
    """GPT-2's learned absolute position embeddings, added to the token embeddings."""

    name = "learned"
    formula = "none (learned absolute position embeddings)"
    reference = "Radford et al., 2019 (GPT-2)"
    adds_bias = False
    absolute_positions = True
    order = 90


@register
class NoPE(PositionScheme):
    """No position information at all: only the causal mask tells tokens apart."""

    name = "nope"
    formula = "none (no position information)"
    reference = "Kazemnejad et al., NeurIPS 2023 (NoPE)"
    adds_bias = False
    order = 91
