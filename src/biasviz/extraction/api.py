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
from biasviz.extraction.request import ExtractRequest, run
from biasviz.extraction.run import ExtractResult
from biasviz.model import BiasGPTForCausalLM


def as_adapter(model_or_path: Any, *, scheme: str | None = None, forward: Callable[[torch.Tensor], Any] | None = None,
               placement: Any = None) -> ModelAdapter:  # fmt: skip
    """An adapter for what the user gave: an adapter, a ``torch.nn.Module`` (traced), ``code.py:FACTORY``,
    or anything ``--model`` accepts (``placement``: a transformers directory spread by a device map). The
    combinations that cannot apply (a device map for a module, say) are refused by :class:`ExtractRequest`."""
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
    if isinstance(model_or_path, (str, Path)):
        if is_factory_spec(model_or_path):
            return load_factory(str(model_or_path), scheme=scheme)
        return load_model(model_or_path, scheme, placement=placement)
    raise BiasvizError(f"cannot extract from a {type(model_or_path).__name__}: give a torch.nn.Module or a path")


def _token_array(input_ids: Any) -> np.ndarray:
    """Token ids as given (a tensor, an array, nested lists) as one (samples, T) array; what cannot be one is a
    BiasvizError saying why (rows of different lengths, a tensor on the meta device that holds no values)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.is_meta:
            raise BiasvizError("input_ids are on the meta device, which holds shapes but no values: give token ids "
                               "on the CPU or a GPU")  # fmt: skip
        input_ids = input_ids.detach().cpu().numpy()
    try:
        ids = np.asarray(input_ids)
    except (ValueError, TypeError) as exc:  # numpy refuses ragged nesting
        raise BiasvizError("input_ids must be token ids of one length per sample, a (samples, T) array; rows of "
                           f"different lengths cannot be one ({str(exc).splitlines()[0][:120]})") from None  # fmt: skip
    if ids.dtype == object:
        raise BiasvizError("input_ids must be a (samples, T) array of integer token ids, not nested objects "
                           "(rows of different lengths?)")  # fmt: skip
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
    device_map: str | dict[str, Any] | None = None,
    max_memory: str | dict[Any, Any] | None = None,
    offload_folder: str | Path | None = None,
    compression: str | None = None,
    **options: Any,
) -> ExtractResult:
    """Run a model on token ids (samples, T) and write its biases and attention weights as format 1.

    ``model_or_path``: a ``torch.nn.Module`` (called as ``model(batch)``, or ``forward(batch)`` for other
    signatures; its SDPA / flex_attention calls are traced and ``layers`` are call indices), a biasviz
    checkpoint, or any path ``biasviz extract --model`` accepts. ``scheme`` names the bias in the file
    (default: the checkpoint's, or "captured"). Other ``options`` are :func:`biasviz.extraction.run.extract`'s
    (``dtype``, ``model_dtype``, ``capture``, ``seed``, ``progress``, ``attrs``); ``progress=False`` prints nothing
    at all, transformers' "Loading weights" bar included. ``summary=True`` writes the docs/hdf5.md, 'Summary files'
    summary instead of every sample's matrices, with maps of at most ``resolution`` x ``resolution`` blocks.
    ``device_map`` (``max_memory``, ``offload_folder``): a transformers directory too large for one device, spread
    by accelerate as ``extract --device-map`` does; it runs where the map puts it (``device`` stays "auto").
    ``compression``: how a full file's matrices are stored, as ``extract --compression``: "gzip" (the default,
    level 1), "gzip:N", "lzf" or "none" (summaries keep their own gzip).
    Every argument is checked as ``biasviz extract`` checks its options (:class:`ExtractRequest`), with its messages.
    """
    from biasviz.adapters.device_map import offload_space, placement_attrs
    from biasviz.common.devices import PeakMemory
    from biasviz.common.progress import library_bars

    ids = _token_array(input_ids)
    known = {k: options.pop(k) for k in ("dtype", "model_dtype", "capture", "seed", "progress") if k in options}
    request = ExtractRequest(model_or_path, out, layers=layers, seq_len=int(ids.shape[-1]), batch_size=batch_size,
                             device=device, force=force, forward=forward, scheme=scheme, summary=summary,
                             resolution=resolution, device_map=device_map, max_memory=max_memory,
                             offload_folder=offload_folder, compression=compression, **known)  # fmt: skip
    placement = request.placement()
    with offload_space(placement) as placement:  # a temporary offload folder lives as long as the run
        peaks = PeakMemory() if placement is not None else None
        with library_bars(request.progress):  # progress=False: no "Loading weights" bar either
            adapter = as_adapter(model_or_path, scheme=scheme, forward=forward, placement=placement)
        if placement is not None:  # inputs go where the first layer runs; the file says where each module ran
            device = adapter.device
            options["attrs"] = {**(options.get("attrs") or {}), **placement_attrs(adapter.model, placement, peaks)}
        options.setdefault("text_source", "input_ids given to biasviz.extract")
        return run(request, adapter, ids, Path(out), layers=layers, device=device, **options)
