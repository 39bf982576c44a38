"""Capture biases and attention weights from the attention calls of any model: SDPA, flex_attention, torch's
attention layers, and attention written out in eager PyTorch."""

from biasviz.tracing.calls import MASKED_BELOW, AttentionCall
from biasviz.tracing.mode import Trace, trace

__all__ = ["MASKED_BELOW", "AttentionCall", "Trace", "trace"]
