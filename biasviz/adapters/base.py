"""What extraction needs from a model, whatever its architecture.

An adapter wraps a loaded model and knows where its additive bias and its post-softmax weights
pass, so that :mod:`biasviz.extract` can capture them with forward hooks for any architecture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# What a stored bias means (HDF5 attribute ``bias_convention``):
RELATIVE = "relative"  # b_h(i, j) exactly as SPEC section 1 writes it (e.g. ALiBi: -m_h * (i - j))
KEY_POSITION = "key-position"  # BLOOM-style ALiBi: +m_h * j, equal to -m_h * (i - j) plus a per-row constant


@dataclass
class Captured:
    """Tensors captured in one forward pass, by layer: bias (1 or B, H, T, T), weights (B, H, T, T)."""

    bias: dict[int, torch.Tensor] = field(default_factory=dict)
    weights: dict[int, torch.Tensor] = field(default_factory=dict)

    def clear(self) -> None:
        self.bias.clear()
        self.weights.clear()


class _StopForward(Exception):
    """Raised by a hook to end a forward pass once everything wanted has been captured."""


@contextlib.contextmanager
def stop_after(module: nn.Module | None) -> Iterator[None]:
    """Within the block, a forward pass ends (quietly) as soon as ``module`` has run."""
    if module is None:
        yield
        return

    def _hook(*_: Any) -> None:
        raise _StopForward

    handle = module.register_forward_hook(_hook)
    try:
        yield
    except _StopForward as stop:
        # the traceback holds every frame of the stopped forward, and with them its activations: let them go
        # now rather than at the next garbage collection (which would double the peak memory of a next pass)
        stop.__traceback__ = None
    finally:
        handle.remove()


class ModelAdapter:
    """Base class: a model plus the facts extraction records about it.

    Subclasses implement :meth:`capture` (attach hooks for the given layers, remove them on exit)
    and :meth:`forward`.
    """

    architecture: str = ""  # 'biasviz-gpt2', 'nanogpt', 'bloom', 'mpt', 'falcon', 't5-encoder', ...
    bias_convention: str = RELATIVE

    def __init__(
        self,
        model: nn.Module,
        *,
        scheme: str,
        n_layers: int,
        n_heads: int,
        source: str,
        sha256: str = "",
        max_length: int | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.model = model
        self.scheme = scheme
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.source = source
        self.sha256 = sha256
        self.max_length = max_length
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer or None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> ModelAdapter:
        self.model.to(device)
        return self

    def resolve_layers(self, spec: int | str | list[int]) -> list[int]:
        """``-1`` (last), an index, a list, or ``"all"`` -> sorted 0-based layer indices."""
        from biasviz.errors import BiasvizError

        if spec == "all":
            return list(range(self.n_layers))
        items = spec if isinstance(spec, list) else [int(spec)]
        out = []
        for layer in items:
            idx = layer + self.n_layers if layer < 0 else layer
            if not 0 <= idx < self.n_layers:
                raise BiasvizError(
                    f"--layer {layer} out of range: the model has {self.n_layers} layers "
                    f"(0..{self.n_layers - 1}, or -1)"
                )
            out.append(idx)
        return sorted(set(out))

    @contextlib.contextmanager
    def capture(self, layers: list[int], want_bias: bool = True) -> Iterator[Captured]:
        """Attach hooks on ``layers`` for the duration of the block; each forward fills the result."""
        raise NotImplementedError
        yield Captured()  # pragma: no cover

    def forward(self, input_ids: torch.Tensor) -> None:
        """Run the model on (B, T) token ids (no gradients); outputs are not needed."""
        raise NotImplementedError
