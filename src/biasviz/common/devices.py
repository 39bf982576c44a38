"""Choosing the torch device (``--device auto|cpu|cuda[:k]``) and precision, and running a model there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

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
    model is neither moved nor rounded by an extraction. A model already in place is not copied. A model placed
    by a device map (:func:`device_mapped`) is left where it is: its inputs go to :func:`input_device`.
    """

    if device_mapped(model):  # spread by a device map: every module stays where the map put it
        _check_precision(model, dtype)
        yield model
        return

    def convert(t: torch.Tensor, own: bool = False) -> torch.Tensor:
        cast = dtype is not None and t.is_floating_point() and not own
        return t.to(device=device, dtype=dtype if cast else None)

    params = list(model.parameters())
    saved = [p.data for p in params]
    owners = [(m, name, b) for m in model.modules() for name, b in m._buffers.items() if b is not None]
    new_buffers: dict[int, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for p in params:
                p.data = convert(p.data)
            for m, name, b in owners:  # a buffer shared by several modules stays shared
                m._buffers[name] = new_buffers.setdefault(id(b), convert(b, own=rotary_buffer(m, name)))
        yield model
    finally:
        for p, data in zip(params, saved, strict=True):
            p.data = data
        for m, name, b in owners:
            m._buffers[name] = b


def rotary_buffer(module: nn.Module, name: str) -> bool:
    """Whether buffer ``name`` of ``module`` holds rotary frequencies (``inv_freq``, a rotary module's cos and sin
    tables): transformers keeps them in float32 whatever the model's dtype (angles of position·θ in bfloat16 are
    off by 1.7e-2 at T = 64), and so does a model run in another dtype here."""
    return "inv_freq" in name or "rotary" in type(module).__name__.lower()


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



# -- models spread by a device map (transformers' device_map, accelerate's hooks) -------------------------------


def device_mapped(model: nn.Module) -> bool:
    """Whether ``model`` was placed by a device map (``from_pretrained(device_map=...)``), so must not be moved."""
    return bool(getattr(model, "hf_device_map", None))


def _hooks(module: nn.Module) -> list[Any]:
    """accelerate's hooks on ``module`` (a SequentialHook holds several)."""
    hook = getattr(module, "_hf_hook", None)
    return [] if hook is None else list(getattr(hook, "hooks", [hook]))


def _as_device(value: Any) -> torch.device:
    return torch.device("cuda", value) if isinstance(value, int) else torch.device(value)


def input_device(model: nn.Module) -> torch.device:
    """Where ``model`` takes its inputs: where its first parameter lies (the CPU if it has none); for a model placed
    by a device map, where its input embedding runs (an offloaded one lies on the meta device: its hook says)."""
    if not device_mapped(model):
        first_parameter = next(iter(model.parameters()), None)
        return first_parameter.device if first_parameter is not None else torch.device("cpu")
    first = getattr(model, "get_input_embeddings", None)
    try:
        embedding = first() if callable(first) else None
    except (NotImplementedError, AttributeError):
        embedding = None
    for module in ([embedding] if isinstance(embedding, nn.Module) else []) + list(model.modules()):
        for hook in _hooks(module):
            if getattr(hook, "execution_device", None) is not None:
                return _as_device(hook.execution_device)
        real = next((p for p in module.parameters() if not p.is_meta), None)
        if real is not None:
            return real.device
    return torch.device("cpu")


def placed_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor | None]]:
    """Every parameter and buffer of ``model`` that has its values in memory (an offloaded one, on the meta device
    between calls, from where its hook keeps it in host memory); None for one that has no values anywhere. Weights
    offloaded to the disk are left out: read ahead, they would cost what the device map saves (a layer after the last
    captured one is never read)."""
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        stores = [h.weights_map for h in _hooks(module) if getattr(h, "offload", False) and h.weights_map is not None]
        for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if id(t) in seen:  # a tied weight, seen under its first name
                continue
            seen.add(id(t))
            full = f"{prefix}.{name}" if prefix else name
            if not t.is_meta:
                yield full, t
                continue
            held = [kept for kept in (_kept(store, name) for store in stores) if kept is not None]
            if not held:
                yield full, None
            elif isinstance(held[0], torch.Tensor):
                yield full, held[0]


def _kept(store: Any, name: str) -> torch.Tensor | bool | None:
    """Where an offload hook's store keeps ``name``: the tensor in host memory, True on the disk, None nowhere.

    accelerate's stores are a ``PrefixedDataset`` over an ``OffloadedWeightsLoader`` (a state dict in memory, an
    index of files on the disk), or a plain dict; none is read from the disk here.
    """
    loader, key = getattr(store, "dataset", store), getattr(store, "prefix", "") + name
    memory = getattr(loader, "state_dict", loader)
    if isinstance(memory, Mapping) and key in memory:
        return memory[key]
    index = getattr(loader, "index", None)
    return True if isinstance(index, Mapping) and key in index else None


def _check_precision(model: nn.Module, dtype: torch.dtype | None) -> None:
    """A device-mapped model runs in the precision it was loaded in: converting it would move every weight."""
    own = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if dtype is not None and own is not None and dtype != own:
        raise BiasvizError(f"the model was placed by a device map in {str(own).removeprefix('torch.')}; it runs in "
                           f"that precision, not {str(dtype).removeprefix('torch.')} (load it in the precision wanted: "
                           "--model-dtype with --device-map)")  # fmt: skip


class PeakMemory:
    """The most memory each device held: the process's peak resident set on the CPU (since it started), the most
    torch allocated on each CUDA device since this object was made. Called when a file is finished, so that the
    attribute covers the whole run (loading included)."""

    def __init__(self) -> None:
        self.cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        for index in self.cuda:
            torch.cuda.reset_peak_memory_stats(index)

    def __call__(self) -> dict[str, int]:
        import resource
        import sys

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        peaks = {"cpu": int(rss if sys.platform == "darwin" else rss * 1024)}
        for index in self.cuda:
            peaks[f"cuda:{index}"] = int(torch.cuda.max_memory_allocated(index))
        return peaks


AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_dtypes() -> dict[str, str]:
    """The device types under a caller's ``torch.autocast`` and its dtype ({"cpu": "bfloat16"}): a model then runs
    its own kernels in that dtype, which the file records."""
    out = {}
    for kind in AUTOCAST_DEVICES:
        if torch.is_autocast_enabled(kind):
            out[kind] = str(torch.get_autocast_dtype(kind)).removeprefix("torch.")
    return out


def autocast_attrs() -> dict[str, str]:
    """A file's root attribute ``autocast`` ("cpu: bfloat16") where the caller runs the model under autocast; none
    otherwise. biasviz's own arithmetic is float32 whatever it says (:func:`without_autocast`)."""
    dtypes = autocast_dtypes()
    return {"autocast": ", ".join(f"{kind}: {dtype}" for kind, dtype in dtypes.items())} if dtypes else {}


@contextlib.contextmanager
def without_autocast() -> Iterator[None]:
    """biasviz's own arithmetic (scores and weights formed from the q and k a call received) in the operands'
    precision, whatever ``torch.autocast`` the caller runs the model under: the numbers are the math of what the
    call received (docs/own-model.md: float32), not another rounding of it."""
    with contextlib.ExitStack() as stack:
        for kind in autocast_dtypes():
            stack.enter_context(torch.autocast(kind, enabled=False))
        yield


@contextlib.contextmanager
def autocast_as(dtypes: Mapping[str, str] | None) -> Iterator[None]:
    """The caller's ``torch.autocast`` (as :func:`autocast_dtypes` read it; None: none) again, around the model's
    own forward inside :func:`without_autocast`."""
    with contextlib.ExitStack() as stack:
        for kind, dtype in (dtypes or {}).items():
            stack.enter_context(torch.autocast(kind, dtype=getattr(torch, dtype)))
        yield
