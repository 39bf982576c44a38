"""Choosing the torch device from ``--device auto|cpu|cuda[:k]``, with clear errors."""

from __future__ import annotations

import torch

from biasviz.errors import BiasvizError


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
