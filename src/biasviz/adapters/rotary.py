"""How a model's attention call pairs the dims it rotates (RoPE), as its own modules say: what
docs/position-measures.md's frequency measures split q and k by."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RotaryLayout:
    """How a model's attention call pairs the dims of a head it rotates."""

    interleaved: bool  # GPT-J's 2f, 2f + 1; else half-split f, f + d_rot/2
    rotary_dims: int  # d_rot: the dims rotated (the first ones of each head)

    @property
    def name(self) -> str:
        return "interleaved" if self.interleaved else "half-split"

    def pair_dims(self) -> tuple[slice, slice]:
        """The two dims of each pair f = 0 .. d_rot/2 - 1, as slices of a head's dims (views, not copies): 2f and
        2f + 1 interleaved, f and f + d_rot/2 half-split."""
        r = self.rotary_dims
        return (slice(0, r, 2), slice(1, r, 2)) if self.interleaved else (slice(0, r // 2), slice(r // 2, r))


def find_rotary(model: torch.nn.Module) -> RotaryLayout | None:
    """The rotary layout of a transformers model, from its own modules: the rotated dims from the ``inv_freq`` of its
    rotary embedding (d_rot / 2 frequencies, whatever the config calls its partial factor), interleaved for the
    GPT-J family; None where no rotary module is found."""
    config = getattr(model, "config", None)
    model_type = str(getattr(config, "model_type", ""))
    interleaved = model_type in ("gptj", "codegen")
    for module in model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor) and "rotary" in type(module).__name__.lower():
            return RotaryLayout(interleaved=interleaved, rotary_dims=2 * int(inv_freq.numel()))
    rotary_dim = getattr(config, "rotary_dim", None)
    if interleaved and isinstance(rotary_dim, int) and rotary_dim >= 2:
        return RotaryLayout(interleaved=True, rotary_dims=rotary_dim)
    return None
