"""Adapter for nanoGPT-style state dicts (``.pt``/``.pth``/``.safetensors``), such as the CABLE reference code's.

Such files hold tensors only: the architecture is read off their shapes, and the keys map onto
:class:`BiasGPTForCausalLM` by renaming prefixes::

    transformer.wte.*            -> embed.*            (vocab, C): vocabulary and width
    transformer.wpe.*            -> pos_embed.*        present: scheme 'learned'
    transformer.h.N.*            -> blocks.N.*         N: the layers
    transformer.h.N.attn.h_attn.* -> blocks.N.attn.pos_bias.proj.*   (H, C): scheme 'cable', H heads
    transformer.ln_f.*           -> ln_f.*
    lm_head.weight               -> lm_head.weight     tied when equal to wte

The causal-mask buffers (``attn.bias`` of shape (1, 1, T, T)) are dropped; ``_orig_mod.`` (torch.compile)
and ``module.`` (DDP) prefixes are stripped; ``{'model': state_dict, 'model_args': {...}}`` checkpoints
(nanoGPT's ``ckpt.pt``) are unwrapped. transformers' GPT-2 state dicts (Conv1D weights stored
transposed) are recognised by the shape of ``c_attn.weight`` and transposed back.

Pickles are only ever read with ``torch.load(weights_only=True)``: a file that would run code when
unpickled is refused.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.adapters.files import load_tensor_file, tokenizer_in
from biasviz.common.errors import BiasvizError
from biasviz.common.hashing import sha256_file
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM
from biasviz.schemes import SCHEMES, canonical_name, info

STATE_DICT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
NANOGPT_CHECKPOINTS = ("ckpt.pt",)  # nanoGPT's out_dir holds its checkpoint under this name
DEFAULT_HEAD_DIM = 64
_WRAPPER_KEYS = ("model", "state_dict", "model_state_dict")
_STRIP_PREFIXES = ("_orig_mod.", "module.")
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_RENAMES = (  # (pattern, replacement), applied in order to every key
    (r"^transformer\.wte\.", "embed."),
    (r"^transformer\.wpe\.", "pos_embed."),
    (r"^transformer\.ln_f\.", "ln_f."),
    (r"^transformer\.h\.(\d+)\.", r"blocks.\1."),
    (r"\.attn\.h_attn\.", ".attn.pos_bias.proj."),
)


@dataclass
class StateDictLayout:
    """What the keys and shapes of a state dict say about the model."""

    state: dict[str, torch.Tensor]
    n_layer: int
    n_embd: int
    vocab_size: int
    linear_bias: bool  # Linear/LayerNorm bias vectors present (not the positional bias)
    scheme_from_keys: str | None
    n_head: int | None
    n_positions: int | None
    tied: bool
    conv1d: bool


def unwrap(obj: Any, path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The flat tensor dict and the model arguments (nanoGPT's ``model_args``/``config``), if any."""
    if not isinstance(obj, Mapping):
        raise BiasvizError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
    args: dict[str, Any] = {}
    for key in ("model_args", "config"):
        if isinstance(obj.get(key), Mapping):
            args = {**dict(obj[key]), **args}
    for key in _WRAPPER_KEYS:
        inner = obj.get(key)
        if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
            obj = inner
            break
    tensors = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise BiasvizError(f"{path} holds no tensors; expected a state dict (torch.save(model.state_dict()))")
    return tensors, args


def _strip(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _STRIP_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    if re.match(r"^(wte|wpe|ln_f|h\.\d+)\.", key):  # transformers' GPT2Model, without the LM head
        key = "transformer." + key
    return key


def read_layout(tensors: Mapping[str, torch.Tensor], args: Mapping[str, Any], path: Path) -> StateDictLayout:
    """Read the architecture off the tensor shapes; rename keys to biasviz's module names."""
    raw = {_strip(k): v for k, v in tensors.items()}
    if "transformer.wte.weight" not in raw:
        sample = ", ".join(sorted(raw)[:4])
        raise BiasvizError(
            f"{path} does not look like a nanoGPT/GPT-2 state dict: no 'transformer.wte.weight' (keys: {sample}, ...)"
        )
    _check_rank(raw, path)
    wte = raw["transformer.wte.weight"]
    vocab, c = (int(s) for s in wte.shape)
    layers = {int(m.group(1)) for k in raw if (m := re.match(r"^transformer\.h\.(\d+)\.", k))}
    if not layers:
        raise BiasvizError(f"{path} holds no transformer blocks (keys transformer.h.N.*)")
    n_layer = max(layers) + 1
    if sorted(layers) != list(range(n_layer)):
        raise BiasvizError(f"{path} lacks blocks {sorted(set(range(n_layer)) - layers)}")

    c_attn = raw.get("transformer.h.0.attn.c_attn.weight")
    if c_attn is None:
        raise BiasvizError(f"{path} has no attn.c_attn.weight: not a GPT-2-style attention layer")
    conv1d = tuple(c_attn.shape) == (c, 3 * c)
    if not conv1d and tuple(c_attn.shape) != (3 * c, c):
        raise BiasvizError(f"{path}: c_attn.weight has shape {tuple(c_attn.shape)}, expected ({3 * c}, {c})")

    mask_shape = None
    state: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        if re.search(r"\.attn\.(bias|masked_bias)$", key):  # causal-mask buffers (1, 1, T, T), not weights
            mask_shape = tuple(value.shape) if value.dim() == 4 else mask_shape
            continue
        if conv1d and key.endswith(_CONV1D):
            value = value.t()
        for pattern, repl in _RENAMES:
            key = re.sub(pattern, repl, key)
        state[key] = value.float() if value.is_floating_point() else value

    h_attn = raw.get("transformer.h.0.attn.h_attn.weight")
    scheme = "cable" if h_attn is not None else ("learned" if "pos_embed.weight" in state else None)
    if h_attn is not None and "pos_embed.weight" in state:
        raise BiasvizError(f"{path} holds both CABLE (h_attn) and learned position (wpe) weights; biasviz has one")
    n_head = int(h_attn.shape[0]) if h_attn is not None else _heads_from_scheme_params(state)
    if n_head is None and args.get("n_head"):
        n_head = int(args["n_head"])
    n_positions = int(state["pos_embed.weight"].shape[0]) if "pos_embed.weight" in state else None
    if n_positions is None:
        n_positions = int(args.get("block_size") or (mask_shape[-1] if mask_shape else 0)) or None
    head = state.get("lm_head.weight")
    tied = head is None or (head.shape == wte.shape and torch.equal(head.float(), wte.float()))
    if tied:
        state.pop("lm_head.weight", None)
    return StateDictLayout(
        state=state,
        n_layer=n_layer,
        n_embd=c,
        vocab_size=vocab,
        linear_bias="blocks.0.attn.c_attn.bias" in state,
        scheme_from_keys=scheme,
        n_head=n_head,
        n_positions=n_positions,
        tied=tied,
        conv1d=conv1d,
    )


# tensors whose shape is read to infer the architecture, and the number of dimensions each must have
_RANKS = {
    r"transformer\.w[tp]e\.weight": 2,
    r"transformer\.h\.\d+\.attn\.[ch]_attn\.weight": 2,
    r"transformer\.h\.\d+\.attn\.pos_bias\.(slopes|r1)": 1,
    r"transformer\.h\.\d+\.attn\.pos_bias\.(table|mlp\.2|proj)\.weight": 2,
}


def _check_rank(raw: Mapping[str, torch.Tensor], path: Path) -> None:
    """A tensor the architecture is read from must have its number of dimensions (a crafted file may not)."""
    for key, value in raw.items():
        dims = next((n for pattern, n in _RANKS.items() if re.fullmatch(pattern, key)), None)
        if dims is not None and value.dim() != dims:
            raise BiasvizError(f"{path}: {key} has shape {tuple(value.shape)}; expected {dims} dimensions")


def _heads_from_scheme_params(state: Mapping[str, torch.Tensor]) -> int | None:
    """Heads from scheme parameters already in biasviz's naming (``...attn.pos_bias.r1`` etc.)."""
    prefix = "blocks.0.attn.pos_bias."
    shapes = {k[len(prefix) :]: v.shape for k, v in state.items() if k.startswith(prefix)}
    for name, axis in (("slopes", 0), ("r1", 0), ("table.weight", 1), ("mlp.2.weight", 0), ("proj.weight", 0)):
        if name in shapes:
            return int(shapes[name][axis])
    return None


def resolve_scheme(layout: StateDictLayout, scheme: str | None, path: Path) -> str:
    """The keys decide where they can (h_attn: cable, wpe: learned); otherwise ``--scheme`` must."""
    told = layout.scheme_from_keys
    if scheme is None:
        if told is None:
            raise BiasvizError(
                f"cannot tell the positional scheme of {path} from its keys (no h_attn, no wpe); "
                f"pass --scheme NAME (one of {', '.join(SCHEMES)})"
            )
        return told
    name = canonical_name(scheme)
    if told is not None and name != told:
        what = "attn.h_attn weights (CABLE)" if told == "cable" else "wpe weights (learned absolute positions)"
        raise BiasvizError(f"--scheme {name} contradicts {path}, which holds {what}; pass --scheme {told} or omit it")
    if told is None and info(name).absolute_positions:
        raise BiasvizError(f"--scheme {name} needs position embeddings (transformer.wpe.weight), which {path} lacks")
    return name


def build_config(
    layout: StateDictLayout,
    scheme: str,
    path: Path,
    *,
    attn_scale: float | None = None,
    activation: str | None = None,
) -> BiasGPTConfig:
    n_head = layout.n_head
    if n_head is None:
        if layout.n_embd % DEFAULT_HEAD_DIM:
            raise BiasvizError(
                f"cannot tell the number of heads of {path}: the keys do not say and width {layout.n_embd} "
                f"is not a multiple of {DEFAULT_HEAD_DIM}; save 'model_args' with 'n_head' beside the weights"
            )
        n_head = layout.n_embd // DEFAULT_HEAD_DIM
        warnings.warn(
            f"{path.name}: the keys do not tell the number of heads; assuming {DEFAULT_HEAD_DIM} dimensions per "
            f"head ({n_head} heads of width {layout.n_embd}). Save model_args={{'n_head': ...}} in the checkpoint "
            "to be sure.",
            stacklevel=2,
        )
    if layout.n_embd % n_head:
        raise BiasvizError(f"{path}: width {layout.n_embd} is not divisible by {n_head} heads")
    return BiasGPTConfig(
        scheme=scheme,
        vocab_size=layout.vocab_size,
        n_positions=layout.n_positions or 1024,
        n_embd=layout.n_embd,
        n_layer=layout.n_layer,
        n_head=n_head,
        linear_bias=layout.linear_bias,
        attn_scale=attn_scale,
        activation=activation or ("gelu_tanh" if layout.conv1d else "gelu"),
        tie_word_embeddings=layout.tied,
    )


def load_parameters(model: BiasGPTForCausalLM, layout: StateDictLayout, scheme: str, path: Path) -> None:
    """Load strictly: only ALiBi's fixed slopes may be absent (they follow from the head count)."""
    expected = model.state_dict()
    for key, value in layout.state.items():
        if key in expected and tuple(value.shape) != tuple(expected[key].shape):
            raise BiasvizError(f"{path}: {key} has shape {tuple(value.shape)}, expected {tuple(expected[key].shape)}")
    result = model.load_state_dict(layout.state, strict=False)
    missing = [k for k in result.missing_keys if not (scheme == "alibi" and k.endswith("pos_bias.slopes"))]
    if model.config.tie_word_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing:
        scheme_keys = [k for k in missing if ".pos_bias." in k]
        hint = (
            f" The '{scheme}' parameters must be stored as transformer.h.N.attn.pos_bias.* (biasviz's names)."
            if scheme_keys
            else ""
        )
        raise BiasvizError(f"{path} lacks weights the model needs: {', '.join(missing[:6])}.{hint}")
    if result.unexpected_keys:
        raise BiasvizError(
            f"{path} holds weights biasviz does not know where to put: {', '.join(result.unexpected_keys[:6])}; "
            "refusing to drop them silently"
        )


class NanoGPTAdapter(BiasGPTAdapter):
    """A nanoGPT-style state dict rebuilt as biasviz's GPT-2 variant (file, or nanoGPT's out_dir)."""

    architecture = "nanogpt"
    accepts_attn_scale = True  # state dicts do not record how q.k is scaled: --no-scale says
    model_types = ()  # state dicts carry no config.json

    @classmethod
    def can_open(cls, path: Path) -> bool:
        """A state dict file, or a folder without config.json that holds nanoGPT's ``ckpt.pt``."""
        if path.is_dir():
            return not (path / "config.json").is_file() and any((path / n).is_file() for n in NANOGPT_CHECKPOINTS)
        return path.suffix.lower() in STATE_DICT_SUFFIXES

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> BiasGPTAdapter:
        if path.is_dir():
            path = next(path / n for n in NANOGPT_CHECKPOINTS if (path / n).is_file())
        return load_state_dict_model(path, scheme, attn_scale=options.get("attn_scale"))


def load_state_dict_model(
    path: str | Path,
    scheme: str | None = None,
    *,
    attn_scale: float | None = None,
    activation: str | None = None,
) -> BiasGPTAdapter:
    """Rebuild a model from a nanoGPT-style state dict file.

    ``attn_scale`` None scales q.k by 1/sqrt(d_head) (nanoGPT); 1.0 reproduces the CABLE reference
    code, which does not scale. ``activation`` None picks nanoGPT's exact GELU, or GPT-2's tanh
    approximation for transformers' (Conv1D) GPT-2 state dicts.
    """
    p = Path(path)
    tensors, args = unwrap(load_tensor_file(p), p)
    layout = read_layout(tensors, args, p)
    name = resolve_scheme(layout, scheme, p)
    config = build_config(layout, name, p, attn_scale=attn_scale, activation=activation)
    if name == "cable" and attn_scale is None:
        warnings.warn(
            f"{p.name}: scaling q.k by 1/sqrt(d_head) as nanoGPT does. The CABLE reference implementation does "
            "not scale it: pass --no-scale to reproduce its attention weights exactly (the bias is the same).",
            stacklevel=2,
        )
    model = BiasGPTForCausalLM(config)
    load_parameters(model, layout, name, p)
    tok = tokenizer_in(p.parent)
    arch = "gpt2-state-dict" if layout.conv1d else "nanogpt"
    model.eval()
    return NanoGPTAdapter(model, source=str(p.resolve()), sha256=sha256_file(p), tokenizer=tok, architecture=arch)
