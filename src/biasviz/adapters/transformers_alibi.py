"""transformers' ALiBi models: BLOOM, MPT and Falcon (``alibi: true``).

Where each model's bias passes (``T`` query = key length, ``H`` heads, ``B`` batch):

- BLOOM: ``BloomAttention(alibi=...)``, (B*H, 1, T) holding m_h * j; added as-is to q.k/sqrt(d).
- MPT: ``MptAttention(position_bias=...)``, (H, 1, max_seq_len) holding m_h * (j' - max_seq_len + 1);
  the module adds its last T columns, i.e. m_h * (j - T + 1).
- Falcon (``alibi=True``): ``FalconAttention(alibi=...)``, m_h * j rounded to bfloat16, added to q.k
  before the 1/sqrt(d) scale, hence m_h * j / sqrt(d) in scaled-score units.

These forms depend on the key position alone: they equal -m_h * (i - j) plus a constant per query
row (``KEY_POSITION``), which the softmax ignores and ``plot --normalize diagonal`` removes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from biasviz.adapters.base import KEY_POSITION, ModelAdapter
from biasviz.adapters.transformers_base import (
    TransformersAdapter,
    check_scheme,
    directory_facts,
    keys_to_query_rows,
    load_eager,
)


class BloomAdapter(TransformersAdapter):
    """BLOOM adds ``beta * alibi`` (beta = 1) to the scaled scores: m_h * j, whatever the query."""

    architecture = "bloom"
    bias_convention = KEY_POSITION
    model_types = ("bloom",)

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        return load_bloom(path, scheme)

    def attention(self, layer: int) -> nn.Module:
        return self.model.h[layer].self_attention

    def _bias_in(self, module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
        hidden = kwargs.get("hidden_states", args[0] if args else None)  # (B, T, D)
        batch, q_len = hidden.shape[:2]
        alibi = kwargs["alibi"]  # (B*H, 1, Tk)
        row = module.beta * alibi.reshape(batch, module.num_heads, 1, alibi.shape[-1])  # (B, H, 1, Tk)
        return keys_to_query_rows(row, q_len)  # (B, H, T, T)


class MptAdapter(TransformersAdapter):
    """MPT adds the last (Tq, Tk) corner of its (H, 1, max_seq_len) bias: m_h * (j - Tk + 1)."""

    architecture = "mpt"
    bias_convention = KEY_POSITION
    model_types = ("mpt",)

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        return load_mpt(path, scheme)

    def attention(self, layer: int) -> nn.Module:
        return self.model.blocks[layer].attn

    def _bias_in(self, module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor | None:
        bias = kwargs.get("position_bias")  # (H, 1, max_seq_len)
        if bias is None:
            return None
        hidden = kwargs.get("hidden_states", args[0] if args else None)  # (B, T, D)
        q_len = k_len = hidden.shape[1]  # no cache: extraction runs whole sequences
        # the same corner MptAttention slices before adding it to the scores
        bias = bias[:, max(0, bias.shape[1] - q_len) :, max(0, bias.shape[2] - k_len) :]  # (H, 1 or Tq, Tk)
        bias = bias.detach()[None]  # (1, H, 1 or Tq, Tk)
        return bias.expand(1, bias.shape[1], q_len, bias.shape[-1])  # (1, H, T, T)


class FalconAdapter(TransformersAdapter):
    """Falcon with ``alibi=True`` adds alibi to q.k before scaling: m_h * j / sqrt(d) per scaled score.

    transformers 5 folds ``alibi / sqrt(d)`` into the attention mask for its SDPA path and then, on the
    eager path (the one that forms the weights), adds ``alibi`` a second time. The model as trained and
    as run by default (SDPA) adds it once, so with ``repair_eager_alibi`` a pre-hook on every attention
    module hands the eager path the plain causal mask; the eager forward then agrees with SDPA.
    """

    architecture = "falcon"
    bias_convention = KEY_POSITION
    model_types = ("falcon",)

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        return load_falcon(path, scheme)

    def __init__(self, model: nn.Module, *, repair_eager_alibi: bool = True, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.repair_handles: list[torch.utils.hooks.RemovableHandle] = []  # permanent, one per layer
        if repair_eager_alibi:
            for block in model.h:
                handle = block.self_attention.register_forward_pre_hook(_falcon_causal_mask_only, with_kwargs=True)
                self.repair_handles.append(handle)

    def attention(self, layer: int) -> nn.Module:
        return self.model.h[layer].self_attention

    def _bias_in(self, module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor | None:
        alibi = kwargs.get("alibi")  # (B, H, 1, Tk) or (B*H, 1, Tk)
        if alibi is None:
            return None
        hidden = kwargs.get("hidden_states", args[0] if args else None)  # (B, T, D)
        batch, q_len = hidden.shape[:2]
        row = alibi.reshape(batch, module.num_heads, 1, alibi.shape[-1]) * module.inv_norm_factor  # (B, H, 1, Tk)
        return keys_to_query_rows(row, q_len)  # (B, H, T, T)


def _falcon_causal_mask_only(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Forward pre-hook: drop the ALiBi copy from the mask when FalconAttention adds ``alibi`` itself.

    The mask carries alibi / sqrt(d) >= 0 in the kept cells and the dtype minimum in the masked ones
    (FalconModel marks them with the same ``< -1`` test used here).
    """
    mask = kwargs.get("attention_mask")
    if kwargs.get("alibi") is None or mask is None or mask.dtype == torch.bool:
        return None
    sdpa_kernel = module.config._attn_implementation == "sdpa" and not kwargs.get("output_attentions", False)
    if sdpa_kernel:  # that path adds the mask only: it must keep its ALiBi
        return None
    kwargs = dict(kwargs)
    kwargs["attention_mask"] = torch.where(mask < -1, mask, torch.zeros((), dtype=mask.dtype, device=mask.device))
    return args, kwargs


def load_bloom(path: Path, scheme: str | None = None) -> ModelAdapter:
    """A BLOOM directory (``model_type: bloom``): ALiBi with Press et al.'s slopes."""
    from transformers import AutoModel

    path = Path(path)
    check_scheme(scheme, "alibi", "BLOOM")
    model = load_eager(AutoModel, path)
    return BloomAdapter(model, scheme="alibi", **directory_facts(path, len(model.h), model.config.n_head))


def load_mpt(path: Path, scheme: str | None = None) -> ModelAdapter:
    """An MPT directory: transformers' MPT always adds ALiBi; sequences cannot exceed ``max_seq_len``."""
    from transformers import AutoModel

    path = Path(path)
    check_scheme(scheme, "alibi", "MPT")
    model = load_eager(AutoModel, path)
    common = directory_facts(path, len(model.blocks), model.config.n_heads)
    return MptAdapter(model, scheme="alibi", max_length=model.config.max_seq_len, **common)


def load_falcon(path: Path, scheme: str | None = None, repair_eager_alibi: bool = True) -> ModelAdapter:
    """A Falcon directory. With ``alibi: true`` (e.g. Falcon-RW) its bias is captured by hooks; a rotary Falcon
    (``alibi: false``, Falcon-7B/40B) adds none and is traced like any RoPE model
    (:func:`~biasviz.adapters.transformers_traced.load_transformers_sdpa`: weights, scores, positional logits)."""
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if not getattr(config, "alibi", False):
        from biasviz.adapters.transformers_traced import load_transformers_sdpa

        return load_transformers_sdpa(path, scheme)
    check_scheme(scheme, "alibi", "Falcon with ALiBi")
    model = load_eager(AutoModel, path)
    common = directory_facts(path, len(model.h), config.num_attention_heads)
    return FalconAdapter(model, scheme="alibi", repair_eager_alibi=repair_eager_alibi, **common)
