"""Capture biases and attention weights from fused attention calls (SDPA, flex_attention) of any model."""

from biasviz.tracing.calls import MASKED_BELOW, AttentionCall
from biasviz.tracing.mode import Trace, trace

__all__ = ["MASKED_BELOW", "AttentionCall", "Trace", "trace"]
