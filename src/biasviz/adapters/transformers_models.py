"""Adapters for public transformers models: BLOOM, MPT, Falcon (ALiBi; :mod:`.transformers_alibi`; a rotary Falcon
is traced),
T5/mT5 (relative buckets) and GPT-2 (weights only), and the table of what ``--model`` opens.

Each adapter loads a ``save_pretrained`` directory with eager attention and captures, with forward
hooks on the library's own attention modules, the additive bias that module receives or returns and
the post-softmax weights it returns (:mod:`.transformers_base`).

- T5/mT5: the self-attention of every block returns ``position_bias`` (1, H, T, T) = w[bucket(j - i), h],
  computed by block 0's ``compute_bias``; T5 does not scale q.k, so this is added to q.k itself.
- GPT-2: no additive bias (learned absolute positions); weights only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from biasviz.adapters.base import RELATIVE, ModelAdapter
from biasviz.adapters.files import parameters_sha256 as weights_sha256  # the former name
from biasviz.adapters.transformers_alibi import (
    BloomAdapter,
    FalconAdapter,
    MptAdapter,
    load_bloom,
    load_falcon,
    load_mpt,
)
from biasviz.adapters.transformers_base import TransformersAdapter, check_scheme, directory_facts, load_eager
from biasviz.common.errors import BiasvizError

Loader = Callable[..., ModelAdapter]


class T5Adapter(TransformersAdapter):
    """Encoder or decoder self-attention of T5/mT5; the bias is the ``position_bias`` each returns.

    The encoder's buckets are bidirectional (its bias differs for j > i and is used there), so the
    encoder adapter is not causal. The decoder adapter feeds the same ids to the encoder and, as
    ``decoder_input_ids``, to the decoder.
    """

    bias_convention = RELATIVE
    model_types = ("t5", "mt5")
    parts = ("encoder", "decoder")

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        return load_t5(path, scheme, part=options.get("part") or "encoder")

    def __init__(self, model: nn.Module, *, part: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.part = part
        self.causal = part == "decoder"

    def stack(self) -> nn.Module:
        return self.model.decoder if self.part == "decoder" else self.model.encoder

    def attention(self, layer: int) -> nn.Module:
        return self.stack().block[layer].layer[0].SelfAttention

    def _bias_out(self, module: nn.Module, output: Any) -> torch.Tensor:
        return output[1].detach()  # (1, H, T, T)

    def _weights_out(self, output: Any) -> torch.Tensor:
        return output[2]  # (B, H, T, T)

    def model_inputs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        if self.part == "decoder":
            return {"input_ids": input_ids, "decoder_input_ids": input_ids, "use_cache": False}
        return {"input_ids": input_ids}


# ------------------------------------------------------------------------------------------------- GPT-2


class GPT2Adapter(TransformersAdapter):
    """Vanilla GPT-2: learned absolute positions, so there is no additive bias to capture."""

    architecture = "gpt2"
    model_types = ("gpt2",)

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        return load_gpt2(path, scheme)

    def attention(self, layer: int) -> nn.Module:
        return self.model.h[layer].attn

    def _weights_out(self, output: Any) -> torch.Tensor:
        return output[1]  # (B, H, T, T)


def load_t5(path: Path, scheme: str | None = None, part: str = "encoder") -> ModelAdapter:
    """A T5 or mT5 directory; ``part`` picks the encoder (default) or the decoder self-attention."""
    from transformers import AutoConfig, AutoModel, AutoModelForTextEncoding

    path = Path(path)
    if part not in ("encoder", "decoder"):
        raise BiasvizError(f"T5 part must be 'encoder' or 'decoder', not '{part}'")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    check_scheme(scheme, "t5", config.model_type.upper())
    model = load_eager(AutoModel if part == "decoder" else AutoModelForTextEncoding, path)
    stack = model.decoder if part == "decoder" else model.encoder
    adapter = T5Adapter(model, part=part, scheme="t5", **directory_facts(path, len(stack.block), config.num_heads))
    adapter.architecture = f"{config.model_type}-{part}"
    return adapter


def load_t5_decoder(path: Path, scheme: str | None = None) -> ModelAdapter:
    """The decoder self-attention of a T5 or mT5 directory (unidirectional buckets, causal)."""
    return load_t5(path, scheme, part="decoder")


def load_gpt2(path: Path, scheme: str | None = None) -> ModelAdapter:
    """A vanilla transformers GPT-2 directory: attention weights only (scheme ``learned``)."""
    from transformers import AutoModel

    path = Path(path)
    check_scheme(scheme, "learned", "GPT-2")
    model = load_eager(AutoModel, path)
    common = directory_facts(path, len(model.h), model.config.n_head)
    return GPT2Adapter(model, scheme="learned", max_length=model.config.n_positions, **common)


TRANSFORMERS_ADAPTERS: list[type[TransformersAdapter]] = [BloomAdapter, MptAdapter, FalconAdapter, T5Adapter,
                                                           GPT2Adapter]  # fmt: skip
# config.json model_type -> loader, read off the adapters
HF_ARCHITECTURES: dict[str, Loader] = {mt: cls.open for cls in TRANSFORMERS_ADAPTERS for mt in cls.model_types}

# (architecture, scheme, command) for README and ``--help`` texts
SUPPORTED: list[tuple[str, str, str]] = [
    ("BLOOM", "alibi", "biasviz extract --model DIR --out data/bloom.h5"),
    ("MPT", "alibi", "biasviz extract --model DIR --out data/mpt.h5"),
    ("Falcon (alibi: true)", "alibi", "biasviz extract --model DIR --out data/falcon.h5"),
    ("Falcon (alibi: false, rotary; traced)", "none", "biasviz extract --model DIR --out data/falcon-rope.h5"),
    ("T5 / mT5 encoder", "t5", "biasviz extract --model DIR --out data/t5-encoder.h5"),
    ("T5 / mT5 decoder", "t5", "biasviz extract --model DIR --part decoder --out data/t5-decoder.h5"),
    ("GPT-2 (weights only)", "learned", "biasviz extract --model DIR --out data/gpt2.h5"),
]


def describe() -> str:
    """The supported transformers architectures as Markdown table rows, one command each.

    >>> describe().splitlines()[2].split(" | ")[:2]
    ['| BLOOM', 'alibi']
    """
    rows = ["| architecture | scheme | command |", "| --- | --- | --- |"]
    rows += [f"| {arch} | {scheme} | `{command}` |" for arch, scheme, command in SUPPORTED]
    return "\n".join(rows)


__all__ = [
    "HF_ARCHITECTURES",
    "TRANSFORMERS_ADAPTERS",
    "SUPPORTED",
    "BloomAdapter",
    "FalconAdapter",
    "GPT2Adapter",
    "MptAdapter",
    "T5Adapter",
    "TransformersAdapter",
    "describe",
    "load_bloom",
    "load_falcon",
    "load_gpt2",
    "load_mpt",
    "load_t5",
    "load_t5_decoder",
    "weights_sha256",
]
