"""GPT-2 variants with swappable positional schemes, registered with transformers' Auto classes."""

from transformers import AutoConfig, AutoModelForCausalLM

from biasviz.model.config import PRESETS, BiasGPTConfig
from biasviz.model.hooks import (
    HOOK_BIAS,
    HOOK_K,
    HOOK_PATTERN,
    HOOK_Q,
    HOOK_SCORES,
    HookPoint,
    capture,
    hook_name,
    hook_points,
)
from biasviz.model.modeling import BiasGPTForCausalLM

AutoConfig.register(BiasGPTConfig.model_type, BiasGPTConfig, exist_ok=True)
AutoModelForCausalLM.register(BiasGPTConfig, BiasGPTForCausalLM, exist_ok=True)

__all__ = [
    "PRESETS",
    "BiasGPTConfig",
    "BiasGPTForCausalLM",
    "HookPoint",
    "capture",
    "hook_name",
    "hook_points",
    "HOOK_BIAS",
    "HOOK_K",
    "HOOK_PATTERN",
    "HOOK_Q",
    "HOOK_SCORES",
]
