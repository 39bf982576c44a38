"""How a model's attention call pairs the dims it rotates (RoPE), as its own modules say: what
docs/position-measures.md's frequency measures split q and k by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# a layer's note where the model holds a rotary module that its call does not apply
NOT_ROTATED = ("the model holds a rotary module, but this call's q and k do not move with position (one token at "
               "every position gives one q and one k): it rotates nothing, so no rotary measures are stored")
PROBE_POSITIONS = 8  # positions of the one repeated token that tells whether a call rotates


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


def rotating_calls(adapter: Any) -> dict[int, bool]:
    """Per call of ``adapter``'s model, whether it rotates q or k, from what it does rather than from what the model
    holds: one token repeated at every position reaches the first rotating call as one vector rotated by position,
    while a call that rotates nothing (and gets no position in its input) has the same q and k at every position. One
    short pass for every call; where a call's q and k cannot be seen (or the model refuses the probe), the model's
    rotary module is taken at its word."""
    layers = list(range(int(adapter.n_layers)))
    ids = torch.zeros(1, PROBE_POSITIONS, dtype=torch.long)
    try:
        with adapter.capture(layers, want_bias=False, want_scores=True) as got:
            adapter.forward(ids.to(adapter.device))
            operands = dict(got.operands)
    except Exception:  # a model that takes no input this short: no evidence either way
        operands = {}
    return {layer: layer not in operands or any(_moves(t) for t in operands[layer][:2]) for layer in layers}
def _moves(t: torch.Tensor) -> bool:
    """Whether (B, H, T, E) differs from its first position anywhere, beyond float rounding."""
    first = t[..., :1, :]
    return bool(((t - first).abs() > 1e-5 * (1.0 + first.abs())).any())
