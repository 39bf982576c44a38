"""Models larger than one device: transformers' ``device_map`` with accelerate (``pip install 'biasviz[big]'``).

``extract --device-map auto|balanced|sequential|FILE.json [--max-memory 0=70GiB,cpu=100GiB] [--offload-folder DIR]``
loads a transformers directory with ``from_pretrained(device_map=..., max_memory=..., offload_folder=...)``:
accelerate spreads its modules over the GPUs, host memory and the disk, and its hooks bring each offloaded
module's weights to where it runs, one module at a time. Extraction then leaves the model where the map put it
(:func:`biasviz.common.devices.placed`); only the inputs move, to where the first layer runs.

Everything a user can get wrong is checked here before any weight is read: the spelling of the map and the
budgets, devices that do not exist, modules the model does not have, a budget too small for one layer, an
offload folder that is a file or cannot be written to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from biasviz.common.errors import BiasvizError
from biasviz.common.jsondoc import JSONTooLarge, loads

STRATEGIES = ("auto", "balanced", "sequential")  # computed by accelerate from the budgets
OFFLOAD_PREFIX = "biasviz-offload-"  # a temporary offload folder: biasviz-offload-PID-XXXX in the temp folder
EXTRA = "pip install 'biasviz[big]'"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip

Device = int | str  # a GPU index, "cpu" or "disk" (accelerate's spelling)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a model's modules go: a strategy or an explicit map, the budgets, and where offloaded weights live."""

    device_map: str | dict[str, Device]  # one of STRATEGIES, or module name -> device
    max_memory: dict[Device, int] | None = None  # bytes per device (GPU index or "cpu")
    offload_folder: Path | None = None  # None until :func:`offload_space` gives a temporary one
    dtype: str = "float32"  # the precision it is loaded (and runs) in
    temporary: bool = False  # the offload folder is ours, removed after the run

    def __str__(self) -> str:
        """Stable across runs (a sweep's plan compares it on --resume): a temporary folder is not named."""
        folder = "temporary" if self.temporary or self.offload_folder is None else str(self.offload_folder)
        return (f"device_map={json.dumps(self.device_map, sort_keys=True)}, max_memory={_memory_text(self.max_memory)}"
                f", offload_folder={folder}, dtype={self.dtype}")  # fmt: skip


def placement_from(device_map: str | Mapping[str, Any] | None, max_memory: str | Mapping[Any, Any] | None = None,
                   offload_folder: str | Path | None = None, model_dtype: Any = None) -> Placement | None:  # fmt: skip
    """The checked placement the user asked for (None: no device map), before any model is read.

    ``device_map``: a strategy, a JSON file or a dict (module -> cpu, disk, K or cuda:K); ``max_memory``:
    ``0=70GiB,cpu=100GiB`` or a dict; ``offload_folder``: where offloaded weights may be written (default: a
    temporary folder, removed afterwards).
    """
    if device_map is None:
        for given, flag in ((max_memory, "--max-memory"), (offload_folder, "--offload-folder")):
            if given is not None:
                raise BiasvizError(f"{flag} applies with --device-map (auto, balanced, sequential or a JSON file)")
        return None
    require_accelerate()
    _give_back_freed_weights()  # before the run allocates anything large
    mapping = _read_map(device_map)
    budgets = parse_max_memory(max_memory) if max_memory is not None else None
    if isinstance(mapping, dict) and budgets is not None:
        raise BiasvizError("--max-memory applies with --device-map auto, balanced or sequential (the budgets a map is "
                           "computed from); a JSON map already says where every module goes")  # fmt: skip
    folder = None if offload_folder is None else check_offload_folder(offload_folder)
    from biasviz.common.devices import resolve_dtype

    dtype = str(resolve_dtype(model_dtype) or "float32").removeprefix("torch.")
    return Placement(mapping, budgets, folder, dtype)


def require_accelerate() -> None:
    """A device map needs accelerate, which biasviz installs only with its ``big`` extra."""
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise BiasvizError(f"--device-map needs the accelerate package, an optional extra: {EXTRA}")


def _read_map(spec: str | Mapping[str, Any]) -> str | dict[str, Device]:
    """A strategy name, or the module -> device map of a JSON file (or a dict given in Python), checked."""
    if isinstance(spec, Mapping):
        return _check_map(dict(spec), "device_map")
    text = str(spec).strip()
    if text.lower() in STRATEGIES:
        return text.lower()
    path = Path(text).expanduser()
    if not path.is_file():
        raise BiasvizError(f"--device-map {text}: not {', '.join(STRATEGIES[:-1])} or {STRATEGIES[-1]}, and no such "
                           "JSON file (a map of module names to cpu, disk or a GPU index)")  # fmt: skip
    from biasviz.common.inputs import read_text

    try:
        data = loads(read_text(path, "device map"), f"--device-map {path}")
    except JSONTooLarge:
        raise
    except ValueError as exc:
        raise BiasvizError(f"--device-map {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise BiasvizError(f"--device-map {path} must hold a JSON object of module names to devices, e.g. "
                           '{"model.embed_tokens": 0, "model.layers.0": "cpu", "model.layers.1": "disk", ...}')
    return _check_map(data, str(path))


def _check_map(data: dict[Any, Any], where: str) -> dict[str, Device]:
    if not data:
        raise BiasvizError(f"--device-map {where} is empty; give every module a device (cpu, disk or a GPU index)")
    out = {}
    for module, device in data.items():
        if not isinstance(module, str):
            raise BiasvizError(f"--device-map {where}: module names are text, not {module!r}")
        out[module] = parse_device(device, f"--device-map {where}: module '{module}'", disk=True)
    return out


def parse_device(value: Any, what: str, *, disk: bool) -> Device:
    """cpu, disk (where allowed), K or cuda:K -> accelerate's spelling; a GPU this machine lacks is an error."""
    import torch

    text = str(value).strip().lower()
    if text == "cpu" or (disk and text == "disk"):
        return text
    match = re.fullmatch(r"(?:cuda:)?(\d+)|cuda", text)
    if isinstance(value, bool) or match is None:
        places = "cpu, disk, K or cuda:K" if disk else "cpu, K or cuda:K"
        raise BiasvizError(f"{what} names the device '{value}'; use {places} (K a GPU index)")
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        have = f"GPUs 0..{count - 1}" if count else "no CUDA GPU"
        raise BiasvizError(f"{what} names GPU {index} (cuda:{index}), which does not exist: this machine has {have}")
    return index


LARGEST_SIZE = 2.0**63  # bytes: beyond any machine, and beyond what a C size can hold


def parse_size(text: str, what: str) -> int:
    """``70GiB``, ``1.5GB``, ``512MiB``, ``1000000`` (bytes) -> bytes.

    >>> parse_size("1.5GiB", "x"), parse_size("70GB", "x"), parse_size("4096", "x")
    (1610612736, 70000000000, 4096)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?b|b)?\s*", str(text), flags=re.IGNORECASE)
    if match is None:
        raise BiasvizError(f"{what}: '{text}' is not a size; write e.g. 70GiB, 500MB or a number of bytes")
    size = float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]
    if not size < LARGEST_SIZE:  # 400 digits: inf, which no int holds
        shown = text.strip() if len(text.strip()) <= 24 else f"{text.strip()[:20]}... ({len(text.strip())} characters)"
        raise BiasvizError(f"{what}: '{shown}' is more than any machine has (at most {LARGEST_SIZE:.0e} bytes)")
    return int(size)


def parse_max_memory(spec: str | Mapping[Any, Any]) -> dict[Device, int]:
    """``0=70GiB,cpu=100GiB`` (or a dict) -> {0: bytes, "cpu": bytes}, each device checked.

    >>> parse_max_memory("cpu=2GiB")
    {'cpu': 2147483648}
    """
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    else:
        items = []
        for part in (p for p in str(spec).split(",") if p.strip()):
            key, sep, value = part.partition("=")
            if not sep:
                raise BiasvizError(f"--max-memory {spec}: '{part.strip()}' is not DEVICE=SIZE; write e.g. "
                                   "0=70GiB,cpu=100GiB")  # fmt: skip
            items.append((key, value))
    if not items:
        raise BiasvizError("--max-memory is empty; write DEVICE=SIZE pairs, e.g. 0=70GiB,cpu=100GiB")
    out: dict[Device, int] = {}
    for key, value in items:
        device = parse_device(key, f"--max-memory {key.strip()}={value}", disk=False)
        size = value if isinstance(value, int) and not isinstance(value, bool) else parse_size(value, "--max-memory")
        if size <= 0:
            raise BiasvizError(f"--max-memory {key.strip()}={value}: a budget must be more than 0 bytes")
        if device in out:  # the last of two budgets winning silently would not be what either said
            raise BiasvizError(f"--max-memory names {device} twice; give each device one budget")
        out[device] = size
    return out


def check_offload_folder(folder: str | Path) -> Path:
    """The user's offload folder: a folder (made where it is missing, when the model is loaded) that can be
    written to. Nothing is created here."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise BiasvizError(f"--offload-folder {path} is a file, not a folder; give a folder for offloaded weights")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise BiasvizError(f"--offload-folder {path}: {existing} is a file, not a folder")
    try:  # os.access would say yes to root on a read-only mount or an immutable folder
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise BiasvizError(f"--offload-folder {path}: cannot write in {existing} ({exc.strerror or exc}); give a "
                           "folder you can write to") from None  # fmt: skip
    return path


@contextlib.contextmanager
def offload_space(placement: Placement | None) -> Iterator[Placement | None]:
    """Within the block, ``placement`` with an offload folder: the user's, or a temporary one removed afterwards
    (after an error or an interrupt too). Temporary folders of runs that were killed are removed first."""
    if placement is None or placement.offload_folder is not None:
        yield placement
        return
    _remove_stale_folders()
    folder = Path(tempfile.mkdtemp(prefix=f"{OFFLOAD_PREFIX}{os.getpid()}-"))
    try:
        yield dataclasses.replace(placement, offload_folder=folder, temporary=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_stale_folders() -> None:
    """Temporary offload folders of biasviz processes that no longer run (killed), owned by this user."""
    for folder in Path(tempfile.gettempdir()).glob(f"{OFFLOAD_PREFIX}*-*"):
        pid = folder.name.removeprefix(OFFLOAD_PREFIX).split("-")[0]
        with contextlib.suppress(OSError, ValueError):
            if folder.is_dir() and folder.stat().st_uid == os.getuid() and not _alive(int(pid)):
                shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- loading ------------------------------------------------------------------------------------------------------
_LOADING: ContextVar[Placement | None] = ContextVar("biasviz_placement", default=None)


@contextlib.contextmanager
def loading_with(placement: Placement | None) -> Iterator[None]:
    """Within the block, the transformers loaders (:func:`current_placement`) place the model as ``placement`` says."""
    token = _LOADING.set(placement)
    try:
        yield
    finally:
        _LOADING.reset(token)


def current_placement() -> Placement | None:
    """The placement of the :func:`biasviz.adapters.load_model` call under way (None: load into memory)."""
    return _LOADING.get()


def load_placed(auto_class: Any, path: Path, placement: Placement, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(path, device_map=..., ...)`` in ``placement.dtype``, after checking the map and the
    budgets against the model's own modules (built empty: no weight is read). The library's own errors pass."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    dtype = getattr(torch, placement.dtype)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    with init_empty_weights():
        if hasattr(auto_class, "from_config"):  # an auto class
            empty = auto_class.from_config(config, trust_remote_code=False)
        else:  # the class config.json names (biasviz.adapters.loading.model_classes)
            empty = auto_class._from_config(config)
    _check_against(empty.to(dtype), placement, dtype)  # sized in the precision it runs in, not the checkpoint's
    folder = placement.offload_folder  # None (no offload_space): weights from a safetensors file need none
    try:
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BiasvizError(f"cannot create the offload folder {folder}: {exc.strerror}") from None
    from biasviz.adapters.loading import load_checked
    from biasviz.adapters.offload_reads import disk_weights_unread

    with _quiet("accelerate.big_modeling"), disk_weights_unread():  # the quiet: "Some parameters are on the meta
        model = load_checked(  # device ...", which is what offloading means
            auto_class, path, device_map=placement.device_map, max_memory=placement.max_memory,
            offload_folder=None if folder is None else str(folder), dtype=dtype, **kwargs,
        )  # fmt: skip
    if not getattr(model, "hf_device_map", None):  # everything fitted on one device: no hooks, but placed all the same
        from biasviz.common.devices import input_device

        model.hf_device_map = {"": _spelled(input_device(model))}
    return model.eval()


def _give_back_freed_weights() -> None:
    """Offloaded weights come and go a layer at a time, each a block of megabytes. glibc raises its mmap threshold
    as such blocks are freed, after which it serves them from its heap and keeps what was freed: a 1.1B model's
    summary at T = 2048 peaked at 4.7 GiB of RSS instead of 3.5 (BENCHMARKS.md, section 12). A fixed 1 MiB threshold,
    set before the run allocates anything large, gives every freed block back at once (glibc on Linux; a
    MALLOC_MMAP_THRESHOLD_ the user set wins). It holds for the rest of the process."""
    import ctypes
    import ctypes.util

    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD back to its default: the raised threshold had raised it too


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """A library logger's warnings left out within the block (its errors still shown)."""
    import logging

    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _spelled(device: Any) -> Device:
    return device.index or 0 if device.type == "cuda" else device.type


def _check_against(empty: Any, placement: Placement, dtype: Any) -> None:
    """A map's modules must be the model's and cover every weight; the device that runs the layers must hold one."""
    from accelerate.utils import compute_module_sizes, get_max_layer_size

    names = dict(empty.named_modules())
    if isinstance(placement.device_map, dict):
        unknown = [m for m in placement.device_map if m not in names]
        if unknown:
            top = ", ".join(n for n, _ in empty.named_children())
            raise BiasvizError(f"--device-map names '{unknown[0]}', which is not a module of this "
                               f"{type(empty).__name__} (its top-level modules: {top})")  # fmt: skip
        keys = list(empty.state_dict())  # parameters and persistent buffers: what accelerate places
        left = [k for k in keys if not any(m == "" or k == m or k.startswith(m + ".") for m in placement.device_map)]
        if left:
            raise BiasvizError(f"--device-map places no module holding '{left[0]}' ({len(left)} weight(s) left out); "
                               "give every module a device")  # fmt: skip
    if placement.max_memory:
        sizes = compute_module_sizes(empty, dtype=dtype)
        no_split = list(getattr(empty, "_no_split_modules", None) or [])
        largest, layers = get_max_layer_size(list(empty.named_children()), sizes, no_split)
        gpus = sorted(k for k in placement.max_memory if isinstance(k, int))
        runs_on = gpus[0] if gpus else "cpu"
        budget = placement.max_memory.get(runs_on)
        if budget is not None and budget < largest:
            from biasviz.common.memory import size_text

            where = f"GPU {runs_on}" if isinstance(runs_on, int) else "the CPU"
            raise BiasvizError(f"--max-memory gives {where}, where the layers run, {size_text(budget)}; it cannot hold "
                               f"one layer ({layers[0] if layers else 'the largest'}: {size_text(largest)} in "
                               f"{placement.dtype}): give it at least that much")  # fmt: skip


def placement_attrs(model: Any, placement: Placement | None, peaks: Any) -> dict[str, Any]:
    """Root attributes of a placed run: the device map as loaded, the budgets, each device's peak memory (``peaks``
    is called when the file is finished)."""
    if placement is None:
        return {}
    attrs: dict[str, Any] = {"device_map": dict(getattr(model, "hf_device_map", None) or {}), "peak_memory": peaks}
    if placement.max_memory:
        attrs["max_memory"] = {str(k): v for k, v in placement.max_memory.items()}
    return attrs


def _memory_text(budgets: Mapping[Device, int] | None) -> str:
    return "none" if not budgets else ",".join(f"{k}={v}" for k, v in budgets.items())
