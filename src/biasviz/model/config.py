"""Configuration of the GPT-2-small variants, and the named size presets."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

from biasviz.common.arguments import ArgumentValueError
from biasviz.common.errors import BiasvizError
from biasviz.schemes import canonical_name, get_scheme

# Size presets. `tiny` trains a few hundred steps in under a minute on two CPU cores and keeps
# GPT-2-small's 12 heads, so its figures have the same 4 x 3 layout.
PRESETS: dict[str, dict[str, int]] = {
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257},
    "tiny": {"n_layer": 2, "n_head": 12, "n_embd": 96, "n_positions": 1024, "vocab_size": 2048},
}


class BiasGPTConfig(PreTrainedConfig):
    """GPT-2 (pre-LN, GELU MLP, tied embeddings) with the position scheme swapped.

    ``scheme_options`` holds the scheme's own options (e.g. ``{"slopes": "interleaved"}`` for ALiBi);
    ``n_positions`` is the size of the absolute position table (``learned``) and the default context.
    ``share_position_params`` makes every layer use the first layer's scheme parameters.
    ``linear_bias`` gives the Linear and LayerNorm layers their bias vectors (GPT-2 has them; a nanoGPT
    model may not): it has nothing to do with the positional bias. Configs that call it ``bias`` load.
    ``attn_scale`` multiplies q.k before the bias is added: ``None`` means GPT-2's 1/sqrt(d_head);
    ``1.0`` reproduces implementations that do not scale (the CABLE reference code, for one).
    ``activation`` is the MLP's GELU: ``gelu_tanh`` (GPT-2's approximation) or ``gelu`` (exact, as
    nanoGPT's ``nn.GELU()``), so that checkpoints of either kind are reproduced exactly.
    """

    model_type = "biasviz_gpt2"
    attribute_map = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "max_position_embeddings": "n_positions",
        "bias": "linear_bias",  # the former name of the flag, still readable
    }

    def __init__(
        self,
        scheme: str = "alibi",
        scheme_options: dict[str, Any] | None = None,
        vocab_size: int = 50257,
        n_positions: int = 1024,
        n_embd: int = 768,
        n_layer: int = 12,
        n_head: int = 12,
        linear_bias: bool = True,
        layer_norm_epsilon: float = 1e-5,
        dropout: float = 0.0,
        initializer_range: float = 0.02,
        share_position_params: bool = False,
        attn_scale: float | None = None,
        activation: str = "gelu_tanh",
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ) -> None:
        self.scheme = canonical_name(scheme)
        for name, value in (("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd), ("vocab_size", vocab_size),
                            ("n_positions", n_positions)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # 0 heads: a division by zero
                raise ArgumentValueError(f"{name} must be a whole number of at least 1, not {value!r}")
        if scheme_options is not None and not isinstance(scheme_options, dict):
            raise BiasvizError(f"scheme_options must be a mapping of option names to values, not {scheme_options!r}")
        self.scheme_options = dict(scheme_options or {})
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.n_embd = n_embd
        self.n_layer = n_layer
        self.n_head = n_head
        if "bias" in kwargs:  # the flag's name in configs written before it was renamed
            linear_bias = bool(kwargs.pop("bias"))
        self.linear_bias = linear_bias
        self.layer_norm_epsilon = layer_norm_epsilon
        self.dropout = dropout
        self.initializer_range = initializer_range
        self.share_position_params = share_position_params
        self.attn_scale = None if attn_scale is None else float(attn_scale)
        if activation not in ("gelu_tanh", "gelu"):
            raise BiasvizError(f"unknown activation '{activation}'; use gelu_tanh (GPT-2) or gelu (exact)")
        self.activation = activation
        if n_embd % n_head:
            raise BiasvizError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
        get_scheme(self.scheme).check_options(self.scheme_options, n_head)  # a bad value fails here, before work
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def scheme_class(self) -> type:
        return get_scheme(self.scheme)

    @classmethod
    def from_preset(cls, preset: str, scheme: str, **overrides: Any) -> BiasGPTConfig:
        """A config for a named preset (``tiny``, ``gpt2-small``) with the given scheme."""
        if preset not in PRESETS:
            raise BiasvizError(f"unknown preset '{preset}'; valid presets: {', '.join(PRESETS)}")
        return cls(scheme=scheme, **{**PRESETS[preset], **overrides})
