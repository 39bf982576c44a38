"""Model adapters: one interface (:class:`ModelAdapter`) for every model biasviz extracts from.

:func:`load_model` picks the adapter from what ``--model`` points at:

- a directory whose ``config.json`` says ``model_type: biasviz_gpt2`` -> biasviz's own GPT-2 variant;
- a directory of another transformers architecture -> ``HF_ARCHITECTURES`` (BLOOM, MPT, ...);
- a state dict file (``.pt``, ``.pth``, ``.bin``, ``.ckpt``, ``.safetensors``) -> the nanoGPT adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from biasviz.adapters.base import KEY_POSITION, RELATIVE, Captured, ModelAdapter
from biasviz.errors import BiasvizError

BIASVIZ_MODEL_TYPE = "biasviz_gpt2"
_NANOGPT_CHECKPOINTS = ("ckpt.pt",)  # nanoGPT's out_dir holds its checkpoint under this name


def hf_architectures() -> dict[str, Callable[[Path, str | None], ModelAdapter]]:
    """transformers architectures other than biasviz's own, by config.json ``model_type`` (may be empty)."""
    try:
        from biasviz.adapters.transformers_models import HF_ARCHITECTURES
    except ModuleNotFoundError as exc:
        if exc.name != "biasviz.adapters.transformers_models":
            raise  # the module exists but something it needs is missing: say so, do not hide it
        return {}
    return dict(HF_ARCHITECTURES)


def _model_type(directory: Path) -> str:
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BiasvizError(f"cannot read {directory / 'config.json'}: {exc}") from exc
    if not isinstance(config, dict) or not config.get("model_type"):
        raise BiasvizError(f"{directory / 'config.json'} names no model_type; is this a transformers checkpoint?")
    return str(config["model_type"])


_ENCODER_DECODER = {"t5", "mt5"}


def check_finite(adapter: ModelAdapter) -> None:
    """Refuse a model whose weights hold NaN or infinity, naming the first such tensor.

    Checked once at load time, for every architecture: a broken checkpoint would otherwise give
    NaN biases and weights, or an error deep inside extraction that does not say where they came from.
    """
    import torch

    model = getattr(adapter, "model", None)
    if not isinstance(model, torch.nn.Module):
        return
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            kinds = [k for k, bad in (("NaN", t.isnan().any()), ("infinite", t.isinf().any())) if bool(bad)]
            raise BiasvizError(
                f"{adapter.source}: weight '{name}' holds {' and '.join(kinds)} values "
                f"({int((~torch.isfinite(t)).sum())} of {t.numel()}); the checkpoint is broken "
                "(diverged training or a damaged file): use an earlier checkpoint"
            )


def load_model(
    path: str | Path,
    scheme: str | None = None,
    *,
    attn_scale: float | None = None,
    part: str | None = None,
) -> ModelAdapter:
    """Load whatever ``--model`` names, wrap it in the right adapter and check its weights are finite."""
    adapter = _load_model(path, scheme, attn_scale=attn_scale, part=part)
    check_finite(adapter)
    return adapter


def _load_model(
    path: str | Path,
    scheme: str | None = None,
    *,
    attn_scale: float | None = None,
    part: str | None = None,
) -> ModelAdapter:
    """Load whatever ``--model`` names and wrap it in the right adapter (on the CPU, in eval mode).

    ``scheme`` is needed only where a state dict's keys do not tell it; where the checkpoint records
    its scheme, a different ``scheme`` is an error. ``attn_scale`` (q.k multiplier; None: 1/sqrt(d_head))
    applies to biasviz and nanoGPT-style models only. ``part`` picks the stack of an encoder-decoder
    model (T5: ``encoder`` or ``decoder``); other models have one stack and refuse it.
    """
    from biasviz.adapters.biasviz_gpt import load_biasviz_checkpoint
    from biasviz.adapters.nanogpt import STATE_DICT_SUFFIXES, load_state_dict_model

    p = Path(path).expanduser()
    if not p.exists():
        raise BiasvizError(f"--model {p} does not exist; give a checkpoint directory or a .pt/.pth state dict")
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if p.is_file() and p.suffix == ".safetensors" and (p.parent / "config.json").is_file():
        p = p.parent  # the weights file of a checkpoint directory
    if p.is_dir():
        if not (p / "config.json").is_file():
            for name in _NANOGPT_CHECKPOINTS:
                if (p / name).is_file():
                    return load_state_dict_model(p / name, scheme, attn_scale=attn_scale)
            raise BiasvizError(f"{p} holds no config.json (nor a nanoGPT ckpt.pt); is it a checkpoint directory?")
        model_type = _model_type(p)
        if model_type == BIASVIZ_MODEL_TYPE:
            return load_biasviz_checkpoint(p, scheme, attn_scale=attn_scale)
        loaders = hf_architectures()
        if model_type not in loaders:
            known = ", ".join([BIASVIZ_MODEL_TYPE, *sorted(loaders)])
            raise BiasvizError(f"{p} is a '{model_type}' model, which biasviz cannot read; supported: {known}")
        if attn_scale is not None:
            raise BiasvizError("--no-scale applies to biasviz and nanoGPT-style checkpoints only")
        if part is not None:
            if model_type not in _ENCODER_DECODER:
                raise BiasvizError(f"--part applies to encoder-decoder models (T5); {p} is a '{model_type}' model")
            return loaders[model_type](p, scheme, part=part)
        return loaders[model_type](p, scheme)
    if p.suffix.lower() in STATE_DICT_SUFFIXES:
        return load_state_dict_model(p, scheme, attn_scale=attn_scale)
    raise BiasvizError(
        f"cannot tell what {p} is: give a checkpoint directory (config.json + weights) or a state dict "
        f"({', '.join(STATE_DICT_SUFFIXES)})"
    )


__all__ = ["Captured", "ModelAdapter", "RELATIVE", "KEY_POSITION", "check_finite", "load_model", "hf_architectures"]
