"""Model adapters: one interface (:class:`ModelAdapter`) for every model biasviz extracts from.

:func:`load_model` asks each adapter class whether it can open what ``--model`` points at
(:meth:`ModelAdapter.can_open`), in this order:

- a directory whose ``config.json`` says ``model_type: biasviz_gpt2`` -> biasviz's own GPT-2 variant;
- a state dict file (``.pt``, ``.pth``, ``.bin``, ``.ckpt``, ``.safetensors``) or nanoGPT's out_dir -> nanoGPT;
- a directory of another transformers architecture -> its adapter (BLOOM, MPT, Falcon, T5, GPT-2);
- any other transformers directory -> loaded with SDPA attention and traced (:mod:`biasviz.adapters.traced`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasviz.adapters.base import KEY_POSITION, RELATIVE, ModelAdapter, refuse_meta
from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import check_side_files, read_text, regular_file

if TYPE_CHECKING:
    from biasviz.adapters.device_map import Placement


def adapter_classes() -> list[type[ModelAdapter]]:
    """Every adapter that can open a ``--model`` path, in the order they are asked."""
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.adapters.nanogpt import NanoGPTAdapter

    try:
        from biasviz.adapters.transformers_models import TRANSFORMERS_ADAPTERS
    except ModuleNotFoundError as exc:
        if exc.name != "biasviz.adapters.transformers_models":
            raise  # the module exists but something it needs is missing: say so, do not hide it
        TRANSFORMERS_ADAPTERS = []
    from biasviz.adapters.transformers_traced import TransformersSdpaAdapter

    return [BiasGPTAdapter, NanoGPTAdapter, *TRANSFORMERS_ADAPTERS, TransformersSdpaAdapter]


def hf_architectures() -> dict[str, Callable[..., ModelAdapter]]:
    """transformers architectures other than biasviz's own, by config.json ``model_type``."""
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter

    native = set(BiasGPTAdapter.model_types)
    return {mt: cls.open for cls in adapter_classes() for mt in getattr(cls, "model_types", ()) if mt not in native}


def check_finite(adapter: ModelAdapter) -> None:
    """Refuse a model whose weights hold NaN or infinity, or have no values (the meta device), naming the first
    such tensor.

    Checked once at load time, for every architecture: a broken checkpoint would otherwise give
    NaN biases and weights, or an error deep inside extraction that does not say where they came from.
    """
    import torch

    from biasviz.common.devices import device_mapped, placed_weights

    model = getattr(adapter, "model", None)
    if not isinstance(model, torch.nn.Module):
        return
    if device_mapped(model):  # the weights in memory (offloaded ones too); those on the disk are not read ahead
        tensors: Iterable[tuple[str, Any]] = placed_weights(model)
    else:
        refuse_meta(model, adapter.source)
        tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        if t is None:
            raise BiasvizError(f"{adapter.source}: weight '{name}' has no values (on the meta device, and no device "
                               "map's hook holds it)")  # fmt: skip
        if t.is_floating_point() and not _all_finite(t):
            kinds = [k for k, bad in (("NaN", t.isnan().any()), ("infinite", t.isinf().any())) if bool(bad)]
            raise BiasvizError(
                f"{adapter.source}: weight '{name}' holds {' and '.join(kinds)} values "
                f"({int((~torch.isfinite(t)).sum())} of {t.numel()}); the checkpoint is broken "
                "(diverged training or a damaged file): use an earlier checkpoint"
            )


FINITE_STEP = 1 << 24  # elements checked at a time: a few tens of MiB of temporaries, whatever the tensor


def _all_finite(t: Any) -> bool:
    """Whether every value is finite, checked a slice at a time: ``isfinite`` of a whole bfloat16 embedding works in
    float32 and made a 3B model's load peak at 2.9 GiB instead of 1.1 (BENCHMARKS.md, section 12)."""
    import torch

    flat = t.detach().reshape(-1)
    if flat.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) and flat.numel():
        # the smallest and largest value, one pass without temporaries (10x isfinite on the CPU): both are finite
        # exactly when every value is (amin and amax carry NaN through, and an infinity is one of them)
        return all(bool(torch.isfinite(torch.stack(torch.aminmax(flat[i : i + FINITE_STEP]))).all())
                   for i in range(0, flat.numel(), FINITE_STEP))  # fmt: skip
    return all(bool(torch.isfinite(flat[i : i + FINITE_STEP]).all()) for i in range(0, flat.numel(), FINITE_STEP))


def load_model(
    path: str | Path,
    scheme: str | None = None,
    *,
    attn_scale: float | None = None,
    part: str | None = None,
    placement: Placement | None = None,
) -> ModelAdapter:
    """Load whatever ``--model`` names, wrap it in the right adapter and check its weights are finite.

    ``placement`` (:func:`biasviz.adapters.device_map.placement_from`, with an offload folder from
    :func:`~biasviz.adapters.device_map.offload_space`) spreads a transformers model with a device map.
    """
    from biasviz.adapters.device_map import loading_with
    from biasviz.adapters.files import hash_while_loading

    hash_while_loading(Path(path).expanduser())  # the digest every output records, while transformers imports
    with loading_with(placement):
        adapter = _load_model(path, scheme, attn_scale=attn_scale, part=part, placed=placement is not None)
    check_finite(adapter)
    return adapter


def _load_model(
    path: str | Path,
    scheme: str | None = None,
    *,
    attn_scale: float | None = None,
    part: str | None = None,
    placed: bool = False,
) -> ModelAdapter:
    """Ask each adapter whether it can open ``path``; the first that can loads it (on the CPU, in eval mode).

    ``scheme`` is needed only where a state dict's keys do not tell it; where the checkpoint records
    its scheme, a different ``scheme`` is an error. ``attn_scale`` (q.k multiplier; None: 1/sqrt(d_head))
    applies to biasviz and nanoGPT-style models only. ``part`` picks the stack of an encoder-decoder
    model (T5: ``encoder`` or ``decoder``); other models have one stack and refuse it.
    """
    from biasviz.adapters.files import model_type
    from biasviz.adapters.nanogpt import STATE_DICT_SUFFIXES

    p = Path(path).expanduser()
    if not p.exists():
        raise BiasvizError(f"--model {p} does not exist; give a checkpoint directory or a .pt/.pth state dict")
    regular_file(p / "config.json" if p.is_dir() else p, "checkpoint file")  # a FIFO would block its reader
    # the small files read whole beside the weights: regular and of a sane size (a .pt's folder is the user's:
    # only the names a checkpoint uses are checked there)
    check_side_files(p if p.is_dir() else p.parent, every_json=p.is_dir())
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if p.is_file() and p.suffix == ".safetensors" and (p.parent / "config.json").is_file():
        p = p.parent  # the weights file of a checkpoint directory
    classes = adapter_classes()
    for cls in classes:
        if not cls.can_open(p):
            continue
        if attn_scale is not None and not cls.accepts_attn_scale:
            if (p / "config.json").is_file():
                raise BiasvizError(f"--no-scale applies to state dicts, which do not record how q.k is scaled; "
                                   f"{p / 'config.json'} records it (attn_scale): drop --no-scale")  # fmt: skip
            raise BiasvizError("--no-scale applies to nanoGPT-style state dicts only")
        if part is not None and part not in cls.parts:
            what = model_type(p) if (p / "config.json").is_file() else p.name
            if _encoder_decoder(p):
                raise BiasvizError(f"--part applies to T5 models; {p} is a '{what}' encoder-decoder, traced whole: "
                                   "its encoder, decoder and cross-attention calls are layers, chosen with --layer "
                                   "(--layer all lists them)")  # fmt: skip
            raise BiasvizError(f"--part applies to encoder-decoder models (T5); {p} is a '{what}' model")
        if placed and not getattr(cls, "placeable", False):
            kind = cls.architecture or cls.__name__
            raise BiasvizError(f"--device-map applies to transformers model directories; {p} is a '{kind}' "
                               "checkpoint, loaded whole: use --device")  # fmt: skip
        options = {k: v for k, v in (("attn_scale", attn_scale), ("part", part)) if v is not None}
        return cls.open(p, scheme, **options)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BiasvizError(f"{p} holds no config.json (nor a nanoGPT ckpt.pt); is it a checkpoint directory?")
        known = list(dict.fromkeys(mt for cls in classes for mt in getattr(cls, "model_types", ())))
        known = [*known[:1], *sorted(known[1:])]
        raise BiasvizError(
            f"{p} is a '{model_type(p)}' model, which biasviz cannot read; supported: {', '.join(known)}"
        )
    raise BiasvizError(
        f"cannot tell what {p} is: give a checkpoint directory (config.json + weights) or a state dict "
        f"({', '.join(STATE_DICT_SUFFIXES)})"
    )


def _encoder_decoder(path: Path) -> bool:
    """Whether ``path`` is a transformers directory whose config.json says ``is_encoder_decoder``."""
    from biasviz.common.jsondoc import loads

    if not (path / "config.json").is_file():
        return False
    try:
        config = loads(read_text(path / "config.json", "config.json"), str(path / "config.json"))
    except ValueError:
        return False
    return isinstance(config, dict) and config.get("is_encoder_decoder") is True


__all__ = [
    "ModelAdapter", "RELATIVE", "KEY_POSITION", "adapter_classes", "check_finite", "hf_architectures",
    "load_model",
]  # fmt: skip
