"""Choosing the torch device (``--device auto|cpu|cuda[:k]``) and precision, and running a model there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from biasviz.common.errors import BiasvizError


def resolve_device(spec: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else the CPU; asking for CUDA without one is an error."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise BiasvizError(f"unknown device '{spec}'; use auto, cpu, cuda or cuda:K") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BiasvizError(f"--device {spec} asked for CUDA, but no CUDA GPU is available; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BiasvizError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) present")
    elif device.type != "cpu":
        raise BiasvizError(f"unsupported device '{spec}'; use auto, cpu, cuda or cuda:K")
    return device


MODEL_DTYPES = ("float32", "bfloat16", "float16")


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """``--model-dtype`` as a torch dtype (None: leave the model's own)."""
    if name is None or isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower()
    if key not in MODEL_DTYPES:
        raise BiasvizError(f"unknown model dtype '{name}'; use one of {', '.join(MODEL_DTYPES)}")
    return getattr(torch, key)


@contextlib.contextmanager
def placed(model: nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> Iterator[nn.Module]:
    """Run ``model`` on ``device`` (and in floating ``dtype``) inside the block; afterwards it is as before.

    Parameters keep their identity (hooks, optimisers and tied weights still see the same objects):
    only their data is swapped for a converted copy and swapped back at the end, so the caller's
    model is neither moved nor rounded by an extraction. A model already in place is not copied.
    """

    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)

    params = list(model.parameters())
    saved = [p.data for p in params]
    owners = [(m, name, b) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    new_buffers: dict[int, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for p in params:
                p.data = convert(p.data)
            for m, name, b in owners:  # a buffer shared by several modules stays shared
                m._buffers[name] = new_buffers.setdefault(id(b), convert(b))
        yield model
    finally:
        for p, data in zip(params, saved, strict=True):
            p.data = data
        for m, name, b in owners:
            m._buffers[name] = b


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; afterwards every submodule's own training flag is as it was.

    ``model.train(flag)`` would set one flag on every submodule, so a part the user had put in eval mode inside
    a model in train mode (a frozen encoder, say) would come back in train mode; each is restored by itself.
    """
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags:
            m.training = flag

