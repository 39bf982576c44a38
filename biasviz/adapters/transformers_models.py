"""Adapters for public transformers models: BLOOM, MPT, Falcon (ALiBi), T5/mT5 (relative buckets), GPT-2.

Each adapter loads a ``save_pretrained`` directory with eager attention and captures, with forward
hooks on the library's own attention modules, the additive bias that module receives or returns and
the post-softmax weights it returns. Nothing of the libraries' forward passes is re-implemented.

Where each model's bias passes (``T`` query = key length, ``H`` heads, ``B`` batch):

- BLOOM: ``BloomAttention(alibi=...)``, (B*H, 1, T) holding m_h * j; added as-is to q.k/sqrt(d).
- MPT: ``MptAttention(position_bias=...)``, (H, 1, max_seq_len) holding m_h * (j' - max_seq_len + 1);
  the module adds its last T columns, i.e. m_h * (j - T + 1).
- Falcon (``alibi=True``): ``FalconAttention(alibi=...)``, m_h * j rounded to bfloat16, added to q.k
  before the 1/sqrt(d) scale, hence m_h * j / sqrt(d) in scaled-score units.
- T5/mT5: the self-attention of every block returns ``position_bias`` (1, H, T, T) = w[bucket(j - i), h],
  computed by block 0's ``compute_bias``; T5 does not scale q.k, so this is added to q.k itself.
- GPT-2: no additive bias (learned absolute positions); weights only.

The ALiBi forms depend on the key position alone: they equal -m_h * (i - j) plus a constant per query
row (``KEY_POSITION``), which the softmax ignores and ``plot --normalize diagonal`` removes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from biasviz.adapters.base import KEY_POSITION, RELATIVE, Captured, ModelAdapter, stop_after
from biasviz.errors import BiasvizError
from biasviz.hashing import sha256_files

Loader = Callable[..., ModelAdapter]


# ------------------------------------------------------------------------------------------- file access


def weights_sha256(path: Path) -> str:
    """SHA-256 of the weight file(s), as :mod:`biasviz.hashing` defines it for shards; "" if there are none.

    Prefers safetensors; falls back to PyTorch ``.bin`` files.
    """
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    return sha256_files(files) if files else ""


def load_tokenizer(path: Path) -> Any:
    """The directory's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, or None when there is none."""
    file = path / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def _check_scheme(requested: str | None, actual: str, what: str) -> None:
    """A ``--scheme`` given for a transformers model must name the scheme that model really uses."""
    if requested is None:
        return
    from biasviz.schemes import canonical_name

    if canonical_name(requested) != actual:
        raise BiasvizError(f"{what} uses the '{actual}' scheme; --scheme {requested} does not apply (omit --scheme)")


def _load(auto_class: Any, path: Path) -> nn.Module:
    """Load a local directory in float32 with eager attention (the only path that forms the weights)."""
    try:
        model = auto_class.from_pretrained(
            path, attn_implementation="eager", local_files_only=True, dtype=torch.float32
        )
    except (OSError, ValueError) as exc:
        raise BiasvizError(f"cannot load the transformers model in {path}: {exc}") from exc
    return model.eval()


def _keys_to_query_rows(row: torch.Tensor, q_len: int) -> torch.Tensor:
    """A bias that depends on the key alone, (N, H, 1, Tk), broadcast to every query row (N, H, Tq, Tk).

    Moved to the CPU first: ``expand`` makes a view, so the copy stays one row per head.
    """
    row = row.detach().cpu()
    return row.expand(row.shape[0], row.shape[1], q_len, row.shape[-1])


# ------------------------------------------------------------------------------------------ base adapter


class TransformersAdapter(ModelAdapter):
    """Hooks on one attention module per layer; subclasses say where the bias and the weights pass.

    ``_bias_in`` reads the bias from the module's call (forward pre-hook), ``_bias_out`` from what it
    returns (forward hook); ``_weights_out`` picks the post-softmax weights out of the returned tuple.
    """

    causal: bool = True  # False: every (i, j) cell is used, none should be masked when stored
    context_dependent: bool = False  # none of these biases depends on the input

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.config_json: str = model.config.to_json_string(use_diff=False)  # provenance for the HDF5 file
        self.vocab_size: int = int(model.config.vocab_size)
        self._stop_layer: int | None = None

    @property
    def adds_bias(self) -> bool:
        """False for GPT-2 (learned absolute positions): no ``bias`` dataset then."""
        from biasviz.schemes import get_scheme

        return get_scheme(self.scheme).adds_bias

    def attention(self, layer: int) -> nn.Module:
        """The library's attention module of ``layer``."""
        raise NotImplementedError

    def _bias_in(self, module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return None

    def _bias_out(self, module: nn.Module, output: Any) -> torch.Tensor | None:
        return None

    def _weights_out(self, output: Any) -> torch.Tensor:
        return output[-1]  # (B, H, T, T)

    def _model_inputs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        return {"input_ids": input_ids, "use_cache": False}

    @contextlib.contextmanager
    def capture(self, layers: list[int], want_bias: bool = True) -> Iterator[Captured]:
        """Hooks on the attention modules of ``layers`` only; each forward overwrites the result."""
        captured = Captured()
        handles = []
        previous, self._stop_layer = self._stop_layer, max(layers)
        try:
            for layer in layers:
                module = self.attention(layer)

                def pre_hook(mod: nn.Module, args: tuple, kwargs: dict, layer: int = layer) -> None:
                    bias = self._bias_in(mod, args, kwargs)
                    if bias is not None:
                        captured.bias[layer] = bias  # (1 or B, H, T, T)

                def hook(mod: nn.Module, args: tuple, output: Any, layer: int = layer) -> None:
                    if want_bias:
                        bias = self._bias_out(mod, output)
                        if bias is not None:
                            captured.bias[layer] = bias  # (1 or B, H, T, T)
                    weights = self._weights_out(output)
                    if weights is None:
                        raise BiasvizError(f"{self.architecture} layer {layer} returned no attention weights")
                    captured.weights[layer] = weights.detach().cpu()  # (B, H, T, T)

                if want_bias:
                    handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
                handles.append(module.register_forward_hook(hook))
            yield captured
        finally:
            self._stop_layer = previous
            for handle in handles:
                handle.remove()

    def forward(self, input_ids: torch.Tensor) -> None:
        """Run the model on (B, T) token ids without gradients; the hooks keep what is needed.

        Inside :meth:`capture` the pass ends once the last captured attention module has run: later
        layers would compute nothing that is kept.
        """
        stop = None if self._stop_layer is None else self.attention(self._stop_layer)
        with torch.no_grad(), stop_after(stop):
            self.model(**self._model_inputs(input_ids.to(self.device)))


# ------------------------------------------------------------------------------------------------- ALiBi


class BloomAdapter(TransformersAdapter):
    """BLOOM adds ``beta * alibi`` (beta = 1) to the scaled scores: m_h * j, whatever the query."""

    architecture = "bloom"
    bias_convention = KEY_POSITION

    def attention(self, layer: int) -> nn.Module:
        return self.model.h[layer].self_attention

    def _bias_in(self, module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor:
        hidden = kwargs.get("hidden_states", args[0] if args else None)  # (B, T, D)
        batch, q_len = hidden.shape[:2]
        alibi = kwargs["alibi"]  # (B*H, 1, Tk)
        row = module.beta * alibi.reshape(batch, module.num_heads, 1, alibi.shape[-1])  # (B, H, 1, Tk)
        return _keys_to_query_rows(row, q_len)  # (B, H, T, T)


class MptAdapter(TransformersAdapter):
    """MPT adds the last (Tq, Tk) corner of its (H, 1, max_seq_len) bias: m_h * (j - Tk + 1)."""

    architecture = "mpt"
    bias_convention = KEY_POSITION

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
        bias = bias.detach().cpu()[None]  # (1, H, 1 or Tq, Tk)
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
        return _keys_to_query_rows(row, q_len)  # (B, H, T, T)


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


# ---------------------------------------------------------------------------------------------------- T5


class T5Adapter(TransformersAdapter):
    """Encoder or decoder self-attention of T5/mT5; the bias is the ``position_bias`` each returns.

    The encoder's buckets are bidirectional (its bias differs for j > i and is used there), so the
    encoder adapter is not causal. The decoder adapter feeds the same ids to the encoder and, as
    ``decoder_input_ids``, to the decoder.
    """

    bias_convention = RELATIVE

    def __init__(self, model: nn.Module, *, part: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.part = part
        self.causal = part == "decoder"

    def stack(self) -> nn.Module:
        return self.model.decoder if self.part == "decoder" else self.model.encoder

    def attention(self, layer: int) -> nn.Module:
        return self.stack().block[layer].layer[0].SelfAttention

    def _bias_out(self, module: nn.Module, output: Any) -> torch.Tensor:
        return output[1].detach().cpu()  # (1, H, T, T)

    def _weights_out(self, output: Any) -> torch.Tensor:
        return output[2]  # (B, H, T, T)

    def _model_inputs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        if self.part == "decoder":
            return {"input_ids": input_ids, "decoder_input_ids": input_ids, "use_cache": False}
        return {"input_ids": input_ids}


# ------------------------------------------------------------------------------------------------- GPT-2


class GPT2Adapter(TransformersAdapter):
    """Vanilla GPT-2: learned absolute positions, so there is no additive bias to capture."""

    architecture = "gpt2"

    def attention(self, layer: int) -> nn.Module:
        return self.model.h[layer].attn

    def _weights_out(self, output: Any) -> torch.Tensor:
        return output[1]  # (B, H, T, T)


# ----------------------------------------------------------------------------------------------- loaders


def _common(path: Path, n_layers: int, n_heads: int) -> dict[str, Any]:
    """Facts every adapter records, read from the directory."""
    return {
        "n_layers": n_layers,
        "n_heads": n_heads,
        "source": str(path.resolve()),
        "sha256": weights_sha256(path),
        "tokenizer": load_tokenizer(path),
    }


def load_bloom(path: Path, scheme: str | None = None) -> ModelAdapter:
    """A BLOOM directory (``model_type: bloom``): ALiBi with Press et al.'s slopes."""
    from transformers import AutoModel

    path = Path(path)
    _check_scheme(scheme, "alibi", "BLOOM")
    model = _load(AutoModel, path)
    return BloomAdapter(model, scheme="alibi", **_common(path, len(model.h), model.config.n_head))


def load_mpt(path: Path, scheme: str | None = None) -> ModelAdapter:
    """An MPT directory: transformers' MPT always adds ALiBi; sequences cannot exceed ``max_seq_len``."""
    from transformers import AutoModel

    path = Path(path)
    _check_scheme(scheme, "alibi", "MPT")
    model = _load(AutoModel, path)
    common = _common(path, len(model.blocks), model.config.n_heads)
    return MptAdapter(model, scheme="alibi", max_length=model.config.max_seq_len, **common)


def load_falcon(path: Path, scheme: str | None = None, repair_eager_alibi: bool = True) -> ModelAdapter:
    """A Falcon directory with ``alibi: true`` (e.g. Falcon-RW); rotary Falcon models have no bias to show."""
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if not getattr(config, "alibi", False):
        raise BiasvizError(
            f"the Falcon model in {path} uses rotary position embeddings (alibi: false), not an additive bias; "
            "biasviz reads Falcon models with ALiBi only"
        )
    _check_scheme(scheme, "alibi", "Falcon with ALiBi")
    model = _load(AutoModel, path)
    common = _common(path, len(model.h), config.num_attention_heads)
    return FalconAdapter(model, scheme="alibi", repair_eager_alibi=repair_eager_alibi, **common)


def load_t5(path: Path, scheme: str | None = None, part: str = "encoder") -> ModelAdapter:
    """A T5 or mT5 directory; ``part`` picks the encoder (default) or the decoder self-attention."""
    from transformers import AutoConfig, AutoModel, AutoModelForTextEncoding

    path = Path(path)
    if part not in ("encoder", "decoder"):
        raise BiasvizError(f"T5 part must be 'encoder' or 'decoder', not '{part}'")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    _check_scheme(scheme, "t5", config.model_type.upper())
    model = _load(AutoModel if part == "decoder" else AutoModelForTextEncoding, path)
    stack = model.decoder if part == "decoder" else model.encoder
    adapter = T5Adapter(model, part=part, scheme="t5", **_common(path, len(stack.block), config.num_heads))
    adapter.architecture = f"{config.model_type}-{part}"
    return adapter


def load_t5_decoder(path: Path, scheme: str | None = None) -> ModelAdapter:
    """The decoder self-attention of a T5 or mT5 directory (unidirectional buckets, causal)."""
    return load_t5(path, scheme, part="decoder")


def load_gpt2(path: Path, scheme: str | None = None) -> ModelAdapter:
    """A vanilla transformers GPT-2 directory: attention weights only (scheme ``learned``)."""
    from transformers import AutoModel

    path = Path(path)
    _check_scheme(scheme, "learned", "GPT-2")
    model = _load(AutoModel, path)
    common = _common(path, len(model.h), model.config.n_head)
    return GPT2Adapter(model, scheme="learned", max_length=model.config.n_positions, **common)


HF_ARCHITECTURES: dict[str, Loader] = {
    "bloom": load_bloom,
    "mpt": load_mpt,
    "falcon": load_falcon,
    "t5": load_t5,
    "mt5": load_t5,
    "gpt2": load_gpt2,
}

# (architecture, scheme, command) for README and ``--help`` texts
SUPPORTED: list[tuple[str, str, str]] = [
    ("BLOOM", "alibi", "biasviz extract --model DIR --out data/bloom.h5"),
    ("MPT", "alibi", "biasviz extract --model DIR --out data/mpt.h5"),
    ("Falcon (alibi: true)", "alibi", "biasviz extract --model DIR --out data/falcon.h5"),
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
