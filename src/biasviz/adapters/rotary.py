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


def unread_rotary(name: str) -> str:
    """A layer's note where the model holds a rotary module whose frequencies biasviz cannot read."""
    return (f"the model's {name} rotates q and k in a way biasviz does not read (no inv_freq of one size), so no "
            "rotary measures are stored")


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
        if "rotary" not in type(module).__name__.lower():
            continue
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor):
            return RotaryLayout(interleaved=interleaved, rotary_dims=2 * int(inv_freq.numel()))
        # one module for several kinds of layer, a base each (Gemma-3's local and global layers:
        # sliding_attention_inv_freq, full_attention_inv_freq): the pairs are the same where the sizes are
        sizes = {int(b.numel()) for name, b in module.named_buffers(recurse=False)
                 if name.endswith("inv_freq") and not name.endswith("original_inv_freq")}  # fmt: skip
        if len(sizes) == 1:
            return RotaryLayout(interleaved=interleaved, rotary_dims=2 * sizes.pop())
    rotary_dim = getattr(config, "rotary_dim", None)
    if interleaved and isinstance(rotary_dim, int) and rotary_dim >= 2:
        return RotaryLayout(interleaved=True, rotary_dims=rotary_dim)
    return None


def rotary_module(model: torch.nn.Module) -> str | None:
    """The class name of the first rotary module a model holds (None: none), for the note where it cannot be read."""
    return next((type(m).__name__ for m in model.modules() if "rotary" in type(m).__name__.lower()), None)


def rotating_calls(adapter: Any) -> dict[int, bool]:
    """Per call of ``adapter``'s model, whether it rotates q or k, from what it does rather than from what the model
    holds: one token repeated at every position reaches the first rotating call as one vector rotated by position,
    while a call that rotates nothing (and gets no position in its input) has the same q and k at every position. One
    short pass for every call; where a call's q and k cannot be seen (or the model refuses the probe), the model's
    rotary module is taken at its word."""
    layers = list(range(int(adapter.n_layers)))
    ids = torch.full((1, PROBE_POSITIONS), _probe_token(adapter.model), dtype=torch.long)
    operands: dict[int, tuple[Any, Any]] = {}

    def sink(block: Any) -> None:  # each call's q and k, where the adapter sees them (with the call's scale)
        if block.q is not None and block.k is not None and block.scale is not None:
            operands[block.layer] = (block.q, block.k)

    try:
        with adapter.stream(layers, False, sink, want_scores=bool(adapter.captures_scores)):
            adapter.forward(ids.to(adapter.device))
    except Exception:  # a model that takes no input this short: no evidence either way
        operands.clear()
    return {layer: layer not in operands or any(_moves(t) for t in operands[layer]) for layer in layers}
def _probe_token(model: Any) -> int:
    """A token whose embedding is not zero: a padding id's row is (Gemma's id 0), and a zero input rotated by position
    is still zero, which would read as a call that rotates nothing."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    table = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(table, "weight", None)
    for token in range(8):
        if token == pad:
            continue
        if not isinstance(weight, torch.Tensor) or token >= len(weight) or bool(weight[token].detach().abs().sum() > 0):
            return token
    return 0


def _moves(t: torch.Tensor) -> bool:
    """Whether (B, H, T, E) differs from its first position anywhere, beyond float rounding."""
    first = t[..., :1, :]
    return bool(((t - first).abs() > 1e-5 * (1.0 + first.abs())).any())
