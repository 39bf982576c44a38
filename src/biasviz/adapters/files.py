"""Reading what checkpoints are made of: parameter files, their hashes, tokenizers, untrusted pickles.

("Weights" in biasviz means attention weights, the post-softmax probabilities; a model's learned
tensors are its parameters.)

Shared by every adapter, so that each reads files the same way (and none imports another to do so).
"""

from __future__ import annotations

import contextlib
import math
import pickle
import struct
import warnings
from pathlib import Path
from typing import Any

from biasviz.common.errors import BiasvizError
from biasviz.common.hashing import sha256_files, start_hashing
from biasviz.common.inputs import read_text, regular_file
from biasviz.common.names import utf8_path

PARAMETER_FILE_PATTERNS = ("model.safetensors", "model-*-of-*.safetensors", "pytorch_model.bin", "pytorch_model-*.bin")


def parameter_files(directory: Path) -> list[Path]:
    """The weight files of a transformers-style checkpoint directory (safetensors preferred)."""
    for pattern in PARAMETER_FILE_PATTERNS:
        found = sorted(directory.glob(pattern))
        if found:
            return found
    raise BiasvizError(f"{directory} holds a config.json but no model.safetensors (or pytorch_model.bin) weights")


def hash_while_loading(model: Path) -> None:
    """A checkpoint directory's weight files, hashed for the digest outputs record while the load imports
    transformers (:func:`~biasviz.common.hashing.start_hashing`); anything amiss is the loader's to report."""
    if model.is_dir():
        with contextlib.suppress(BiasvizError, OSError):
            start_hashing(parameter_files(model))


#: bits per element of each safetensors dtype
SAFETENSORS_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
                    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
                    "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}  # fmt: skip


def check_safetensors(path: Path) -> None:
    """Refuse a safetensors file whose header or data is incomplete or does not add up, naming it.

    The layout: 8 bytes of header length n, n bytes of JSON header giving each tensor's dtype, shape and byte
    range, the data. Each range must hold exactly its shape's bytes, ranges must not overlap, and all must lie
    in the file: a header that lies (a shape whose size overflows, a reversed range, F64 over float32 bytes)
    is this one error rather than the library's panic or a tensor read from the wrong bytes.
    """
    from biasviz.common.jsondoc import loads

    size = path.stat().st_size
    with regular_file(path, "safetensors file").open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            header = loads(f.read(n), str(path), max_bytes=n + 1) if 0 <= n <= size - 8 else None
        except ValueError:
            header = None
    if not isinstance(header, dict):
        raise BiasvizError(f"{path} is truncated or damaged (not a readable safetensors file, {size} bytes); "
                           "copy or save it again")  # fmt: skip
    fault = _header_fault({k: v for k, v in header.items() if k != "__metadata__"}, size - 8 - n)
    if fault:
        raise BiasvizError(f"{path} is not a valid safetensors file: {fault}; it is damaged or was not written by "
                           "a safetensors writer: copy or save it again")  # fmt: skip


def _header_fault(tensors: dict[str, Any], data_bytes: int) -> str | None:
    """What is wrong with a safetensors header's tensors over ``data_bytes`` bytes of data (None: nothing)."""
    ranges = []
    for name, v in tensors.items():
        label = f"tensor '{name[:60]}'"
        if not isinstance(v, dict) or v.get("dtype") not in SAFETENSORS_BITS:
            return f"{label} has no known dtype"
        shape, offsets = v.get("shape"), v.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            return f"{label} has no shape of sizes at least 0"
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            return f"{label} has no (begin, end) data offsets"
        begin, end = offsets
        if not 0 <= begin <= end:
            return f"{label} has data offsets {offsets} (reversed or negative)"
        if end > data_bytes:
            return f"{label} ends at byte {end:,} of data, past the {data_bytes:,} bytes the file holds (truncated?)"
        needed = -(-math.prod(shape) * SAFETENSORS_BITS[v["dtype"]] // 8)
        if needed != end - begin:
            return (f"{label} declares {v['dtype']} {shape} ({needed:,} bytes) over {end - begin:,} bytes of data")
        ranges.append((begin, end, name))
    ranges.sort()
    for (_b1, e1, n1), (b2, _e2, n2) in zip(ranges, ranges[1:], strict=False):
        if b2 < e1:
            return f"tensors '{n1[:60]}' and '{n2[:60]}' overlap in the data"
    used = max((e for _b, e, _n in ranges), default=0)
    if used < data_bytes:  # the format's data is exactly its tensors' bytes: more is a stray or damaged file
        return f"it holds {data_bytes - used:,} bytes past its last tensor's data"
    return None


def parameters_sha256(path: Path) -> str:
    """SHA-256 of the weight file(s), as :mod:`biasviz.common.hashing` defines it for shards; "" if there are none.

    Prefers safetensors; falls back to PyTorch ``.bin`` files.
    """
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    return sha256_files(files) if files else ""


def tokenizer_file(source: str | Path) -> Path:
    """Where a checkpoint's own tokenizer.json lies: inside a checkpoint directory, beside a state dict file."""
    from biasviz.data.tokenizer import TOKENIZER_FILE

    p = Path(source)
    return (p if p.is_dir() else p.parent) / TOKENIZER_FILE


def tokenizer_in(directory: Path) -> Any:
    """The ``tokenizer.json`` in ``directory`` as a ``tokenizers.Tokenizer``, or None when there is none."""
    from biasviz.data import load_tokenizer

    file = tokenizer_file(directory)
    if not file.exists():
        return None
    return load_tokenizer(file)


def unsafe_pickle_error(path: Path, exc: BaseException) -> BiasvizError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return BiasvizError(
        f"refusing to load {path}: it holds Python objects that would run code when unpickled, and biasviz "
        f"reads only plain tensors (torch.load with weights_only=True: {first}). If you trust the file, "
        "re-save just its state dict (torch.save(model.state_dict(), ...)) or convert it to safetensors"
    )


def load_tensor_file(path: str | Path) -> Any:
    """Read a state dict (or a checkpoint dict holding one) without executing any code."""
    import torch

    p = regular_file(path, "state dict")
    if p.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        check_safetensors(p)
        try:
            return load_file(utf8_path(p), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise BiasvizError(f"{p} is not a readable safetensors file: {exc}") from exc
    try:
        with warnings.catch_warnings():  # torch's note on pickle protocols is no concern of the user's
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            loaded = torch.load(p, map_location="cpu", weights_only=True)
        check_tensor_sizes(loaded, p)
        return loaded
    except pickle.UnpicklingError as exc:
        if "GLOBAL" in str(exc) or "global" in str(exc).lower().split("weightsunpickler error")[-1]:
            raise unsafe_pickle_error(p, exc) from None  # it names a callable: code that would run
        raise BiasvizError(
            f"{p} is not a readable PyTorch checkpoint (not a pickle of plain tensors); save the state dict with "
            "torch.save(model.state_dict(), ...)"
        ) from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BiasvizError(f"{p} is not a readable PyTorch checkpoint: {first}") from exc
    except (IndexError, KeyError, TypeError, AttributeError, UnicodeDecodeError, struct.error) as exc:
        # the restricted unpickler fails in these ways on bytes that are not a pickle at all
        raise BiasvizError(f"{p} is not a readable PyTorch checkpoint (not a pickle of tensors)") from exc


def check_tensor_sizes(loaded: Any, path: Path) -> None:
    """Refuse a state dict whose tensors declare more than they hold, before any model is built from their shapes.

    A tensor saved with stride 0 (``torch.zeros(1).expand(10**5, 10**5)``) is a few bytes on disk whose shape
    claims a huge width: a model built to match would allocate it in full. Every tensor must own the elements its
    shape declares, and all of them together (as the float32 model built from them) must fit in memory.
    """
    import torch

    from biasviz.common.memory import FLOAT32, memory_budget, size_text

    tensors = loaded.get("model", loaded) if isinstance(loaded, dict) else {}
    tensors = {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)} if isinstance(tensors, dict) else {}
    total = 0
    for name, t in tensors.items():
        held = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        if t.numel() and t.numel() * t.element_size() > held:
            raise BiasvizError(f"{path} is not a plain state dict: tensor '{str(name)[:60]}' declares shape "
                               f"{tuple(t.shape)} ({size_text(t.numel() * t.element_size())}) over "
                               f"{size_text(max(held, 0))} of data (a broadcast view); save the model's own "
                               "state_dict()")  # fmt: skip
        total += t.numel() * FLOAT32
    budget = memory_budget()
    if budget is not None and total > budget:
        raise BiasvizError(f"{path} declares tensors of {size_text(total)} as a float32 model, more than the "
                           f"{size_text(budget)} of memory biasviz may use here")  # fmt: skip


#: config.json's sizes a model is built from, in the spellings of biasviz and transformers: each must be an integer
#: of at least 1 (0 heads divides by zero as transformers builds the model)
CONFIG_SIZES = ("n_head", "num_attention_heads", "num_heads", "n_heads", "num_key_value_heads", "n_layer",
                "num_hidden_layers", "num_layers", "n_embd", "hidden_size", "d_model", "d_kv", "head_dim",
                "vocab_size", "n_positions", "max_position_embeddings", "intermediate_size", "n_inner")  # fmt: skip


def _size(value: Any) -> bool:
    """An integer of at least 1, or a non-empty list of them: one a layer (Gemma 3n's ``intermediate_size``)."""
    if isinstance(value, list):
        return bool(value) and all(type(v) is int and v >= 1 for v in value)
    return type(value) is int and value >= 1


def check_config_sizes(directory: Path) -> None:
    """Refuse a config.json whose model sizes (:data:`CONFIG_SIZES`) are not integers of at least 1 (or lists of
    them, one a layer), before any library builds a model from them; an absent or null size is left to the model's
    default."""
    from biasviz.common.jsondoc import loads

    path = directory / "config.json"
    if not path.is_file():
        return
    try:
        config = loads(read_text(path, "config.json"), str(path))
    except ValueError:
        return  # not JSON: its reader says so
    tables = [config] if isinstance(config, dict) else []
    tables += [v for v in (config.values() if isinstance(config, dict) else ()) if isinstance(v, dict)]
    for table in tables:  # the top level and nested configs (text_config, decoder, ...)
        for key in CONFIG_SIZES:
            value = table.get(key)
            if value is not None and not _size(value):
                raise BiasvizError(f"{path}: {key} = {value!r}, where a model needs an integer of at least 1; "
                                   "the checkpoint's config is damaged")  # fmt: skip


def model_type(directory: Path) -> str:
    """The ``model_type`` of a transformers-style directory's config.json."""
    from biasviz.common.jsondoc import loads

    try:
        config = loads(read_text(directory / "config.json", "config.json"), str(directory / "config.json"))
    except ValueError as exc:
        raise BiasvizError(f"cannot read {directory / 'config.json'}: {exc}") from exc
    if not isinstance(config, dict) or not config.get("model_type"):
        raise BiasvizError(f"{directory / 'config.json'} names no model_type; is this a transformers checkpoint?")
    return str(config["model_type"])
