"""The Python API's entry points for any model: ``biasviz.extraction.run(model_or_path, input_ids, out)``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biasviz.adapters import ModelAdapter, check_finite, load_model
from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.adapters.factory import is_factory_spec, load_factory
from biasviz.adapters.traced import TracedAdapter
from biasviz.common.errors import BiasvizError
from biasviz.extraction.run import ExtractResult
from biasviz.extraction.run import extract as extract_with
from biasviz.model import BiasGPTForCausalLM


def as_adapter(model_or_path: Any, *, scheme: str | None = None,
               forward: Callable[[torch.Tensor], Any] | None = None) -> ModelAdapter:  # fmt: skip
    """An adapter for what the user gave: an adapter, a ``torch.nn.Module`` (traced), ``code.py:FACTORY``,
    or anything ``--model`` accepts."""
    if isinstance(model_or_path, ModelAdapter):
        return model_or_path
    if isinstance(model_or_path, BiasGPTForCausalLM) and forward is None:  # our own: its hook points, any length
        ours = BiasGPTAdapter(model_or_path, source=f"{type(model_or_path).__name__} (given in Python)")
        check_finite(ours)
        return ours
    if isinstance(model_or_path, torch.nn.Module):
        adapter: ModelAdapter = TracedAdapter(model_or_path, forward=forward, scheme=scheme)
        check_finite(adapter)
        return adapter
    if forward is not None:
        raise BiasvizError("forward= applies to a torch.nn.Module given directly")
    if isinstance(model_or_path, (str, Path)):
        if is_factory_spec(model_or_path):
            return load_factory(str(model_or_path), scheme=scheme)
        return load_model(model_or_path, scheme)
    raise BiasvizError(f"cannot extract from a {type(model_or_path).__name__}: give a torch.nn.Module or a path")


def _token_array(input_ids: Any) -> np.ndarray:
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.detach().cpu().numpy()
    ids = np.asarray(input_ids)
    return ids[None] if ids.ndim == 1 else ids


def extract(
    model_or_path: Any,
    input_ids: Any,
    out: str | Path,
    *,
    layers: int | str | list[int] = -1,
    batch_size: int = 1,
    device: str | torch.device = "auto",
    force: bool = False,
    forward: Callable[[torch.Tensor], Any] | None = None,
    scheme: str | None = None,
    summary: bool = False,
    resolution: int | None = None,
    **options: Any,
) -> ExtractResult:
    """Run a model on token ids (samples, T) and write its biases and attention weights as format 1.

    ``model_or_path``: a ``torch.nn.Module`` (called as ``model(batch)``, or ``forward(batch)`` for other
    signatures; its SDPA / flex_attention calls are traced and ``layers`` are call indices), a biasviz
    checkpoint, or any path ``biasviz extract --model`` accepts. ``scheme`` names the bias in the file
    (default: the checkpoint's, or "captured"). Other ``options`` are :func:`biasviz.extraction.run.extract`'s
    (``dtype``, ``model_dtype``, ``progress``, ``attrs``). ``summary=True`` writes the SPEC section 11 summary
    instead of every sample's matrices, with maps of at most ``resolution`` x ``resolution`` blocks.
    """
    adapter = as_adapter(model_or_path, scheme=scheme, forward=forward)
    options.setdefault("text_source", "input_ids given to biasviz.extract")
    if summary:
        from biasviz.extraction.summary import extract_summary

        return extract_summary(adapter, _token_array(input_ids), out, layers=layers, batch_size=batch_size,
                               device=device, force=force, resolution=resolution, **options)  # fmt: skip
    if resolution is not None:
        raise BiasvizError("resolution= applies with summary=True")
    return extract_with(adapter, _token_array(input_ids), out, layers=layers, batch_size=batch_size,
                        device=device, force=force, **options)  # fmt: skip
