"""Loading a placed model without reading the weights that stay on the disk.

transformers' loader (5.x) maps each safetensors file and, for every checkpoint tensor, reads it into memory (and
converts it to the model's precision) before deciding where it goes. For a tensor placed on the disk that is already
in a safetensors file under its own name, the decision is to read it from that file later, while its layer runs:
the copy made at load is thrown away. Its file pages stay mapped, and count in the process's RSS, until the loader
closes the file: a 6 GiB checkpoint with a 1 GiB budget peaked at the whole file's size while loading
(BENCHMARKS.md, section 12).

:func:`disk_weights_unread` hands the loader only the tensors it keeps in memory; those that stay on the disk under
their own name are marked as found, exactly as the loader marks them after reading them. A tensor it must convert
(a weight converter: fused experts, say), write again, quantize, or a buffer kept in memory goes through the loader
unchanged. Where the loader's internals are not the ones this was written for, the block loads as transformers does.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Iterator
from typing import Any

_ENTRY = "convert_and_load_state_dict_in_model"  # transformers.modeling_utils' name for the per-tensor loader
_PARAMETERS = ("model", "state_dict", "load_config", "disk_offload_index")


@contextlib.contextmanager
def disk_weights_unread() -> Iterator[None]:
    """Within the block, ``from_pretrained`` leaves unread the checkpoint tensors its device map sends to the disk."""
    try:
        from transformers import modeling_utils
    except ImportError:
        yield
        return
    original = getattr(modeling_utils, _ENTRY, None)
    if original is None or not _fits(original):
        yield
        return
    setattr(modeling_utils, _ENTRY, _skipping(original))
    try:
        yield
    finally:
        setattr(modeling_utils, _ENTRY, original)


def _fits(function: Callable[..., Any]) -> bool:
    try:
        names = list(inspect.signature(function).parameters)
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key  # noqa: F401
    except (TypeError, ValueError, ImportError):
        return False
    return names[: len(_PARAMETERS)] == list(_PARAMETERS)


def _skipping(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def load(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind(*args, **kwargs).arguments
        left = unread_on_disk(given["model"], given["state_dict"], given["load_config"], given["disk_offload_index"])
        if not left:
            return original(*args, **kwargs)
        given = {**given, "state_dict": {k: v for k, v in given["state_dict"].items() if k not in left}}
        info, index = original(**given)
        info.missing_keys.difference_update(left.values())  # found: read from their file while their layer runs
        return info, index

    return load


def unread_on_disk(model: Any, state_dict: Any, load_config: Any, index: dict[str, Any] | None) -> dict[str, str]:
    """Checkpoint name -> model name of each tensor that stays where it is in its safetensors file: on the disk by
    the map, in the offload index under that very name, reached by renaming only, and a parameter (or an offloaded
    buffer). ``{}`` where anything else is under way (a quantizer, a per-tensor precision plan)."""
    if not index or not isinstance(state_dict, dict):
        return {}
    if getattr(load_config, "hf_quantizer", None) is not None or getattr(load_config, "dtype_plan", None):
        return {}
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    in_file = {e["weight_name"]: name for name, e in index.items()
               if isinstance(e, dict) and e.get("safetensors_file") and e.get("weight_name")}  # fmt: skip
    mapping = copy.deepcopy(list(getattr(load_config, "weight_mapping", None) or []))  # renaming marks them used
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    meta = model.state_dict()
    buffers = set() if getattr(load_config, "offload_buffers", False) else {k for k, _ in model.named_buffers()}
    left = {}
    for key in state_dict:
        target = in_file.get(key)
        if target is None or target in buffers:
            continue
        renamed, converted = rename_source_key(key, renamings, converters, model.base_model_prefix, meta)
        if converted is None and renamed == target:
            left[key] = target
    return left
