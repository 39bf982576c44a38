"""SPEC section 14's ``frequency_use``: which rotary frequencies a head uses (Barbero et al., ICLR 2025, "Round and
round we go"): per head, the mean 2-norm of each rotary pair of q and of k over samples and positions.

A rotation keeps each pair's norm, so the norms of q and k as they reach the attention call (rotated) are those of
the model's q and k before it. Pairs follow the model's own layout: half-split (Llama, GPT-NeoX: dims f and
f + d_rot/2) or interleaved (GPT-J: 2f and 2f + 1); f = 0 turns fastest. Dims past d_rot (partial rotary) are one
last row, the norm of all of them together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from biasviz.summaries.weight_measures import sample_stats


@dataclass(frozen=True)
class RotaryLayout:
    """How a model's attention call pairs the dims of a head it rotates."""

    interleaved: bool  # GPT-J's 2f, 2f + 1; else half-split f, f + d_rot/2
    rotary_dims: int  # d_rot: the dims rotated (the first ones of each head)

    @property
    def name(self) -> str:
        return "interleaved" if self.interleaved else "half-split"

    def pair_dims(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The two dims of each pair f = 0 .. d_rot/2 - 1."""
        f = torch.arange(self.rotary_dims // 2)
        return (2 * f, 2 * f + 1) if self.interleaved else (f, f + self.rotary_dims // 2)


class FrequencyUse:
    """Per sample, the mean over positions of each rotary pair's norm of q and of k: (N, 2, H, pairs [+ 1])."""

    def __init__(self, layout: RotaryLayout, samples: int) -> None:
        self.layout, self.samples = layout, samples
        self.per_sample: torch.Tensor | None = None

    def add(self, first: int, q: torch.Tensor, k: torch.Tensor) -> None:
        """Samples ``first ..``: q and k (B, H, T, hd) as the call received them (for grouped heads, the key of each
        query head's group)."""
        norms = torch.stack([self._norms(q), self._norms(k)], dim=1)  # (B, 2, H, pairs [+ 1])
        if self.per_sample is None:
            self.per_sample = torch.zeros(self.samples, *norms.shape[1:], dtype=torch.float64, device=norms.device)
        self.per_sample[first : first + len(norms)] = norms

    def _norms(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        a, b = (d.to(x.device) for d in self.layout.pair_dims())
        pairs = torch.sqrt(x[..., a].square() + x[..., b].square())  # (B, H, T, pairs)
        rest = x[..., self.layout.rotary_dims :]
        if rest.shape[-1]:
            pairs = torch.cat([pairs, rest.square().sum(-1, keepdim=True).sqrt()], dim=-1)
        return pairs.mean(-2)

    def result(self) -> dict[str, np.ndarray]:
        """``frequency_use`` (2: q, k; H; pairs [+ unrotated]) and, with 3 samples or more, its SE."""
        assert self.per_sample is not None, "no q and k arrived"
        stats, se = sample_stats(self.per_sample)
        out = {"frequency_use": stats[0].float().cpu().numpy()}
        if se is not None:
            out["frequency_use_se"] = se.float().cpu().numpy()
        return out


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
