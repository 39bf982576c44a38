"""Adapter for biasviz's own GPT-2 variant: checkpoint directories written by ``biasviz train``.

Capture uses the model's named hook points (``blocks.{L}.attn.hook_bias`` and ``hook_pattern``), which
pass each layer's matrices in blocks of query rows (:mod:`biasviz.model.hooks`): :meth:`BiasGPTAdapter.stream`
hands the blocks on as they come (a full file lays them together: :mod:`biasviz.extraction.full_matrices`).
The forward pass stops after the last captured attention layer (:meth:`ModelAdapter.forward`).
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from biasviz.adapters.again import FormsRowsAgain
from biasviz.adapters.base import RELATIVE, ModelAdapter, RowBlock
from biasviz.adapters.files import check_safetensors, model_type, parameter_files, tokenizer_in, unsafe_pickle_error
from biasviz.common.errors import BiasvizError
from biasviz.common.hashing import sha256_files
from biasviz.common.names import utf8_path
from biasviz.model import HOOK_BIAS, HOOK_PATTERN, HOOK_SCORES, BiasGPTConfig, BiasGPTForCausalLM, capture, hook_name
from biasviz.schemes import canonical_name
from biasviz.training.provenance import how_trained

CONFIG_FILE = "config.json"
MODEL_TYPE = BiasGPTConfig.model_type


class BiasGPTAdapter(FormsRowsAgain, ModelAdapter):
    """A :class:`BiasGPTForCausalLM` (trained by biasviz, or rebuilt from a nanoGPT state dict)."""

    architecture = "biasviz-gpt2"
    bias_convention = RELATIVE
    fused_rows = True
    captures_scores = True
    accepts_attn_scale = False  # a checkpoint directory's config.json records its q.k scale
    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    def __init__(
        self,
        model: BiasGPTForCausalLM,
        *,
        source: str,
        sha256: str = "",
        tokenizer: Any = None,
        architecture: str | None = None,
    ) -> None:
        cfg = model.config
        super().__init__(
            model, scheme=cfg.scheme, n_layers=cfg.n_layer, n_heads=cfg.n_head, source=source, sha256=sha256,
            max_length=model.max_length, tokenizer=tokenizer, vocab_size=int(cfg.vocab_size),
            config_json=cfg.to_json_string(use_diff=False),
        )  # fmt: skip
        if architecture:
            self.architecture = architecture

    @classmethod
    def can_open(cls, path: Path) -> bool:
        """A directory whose config.json says ``model_type: biasviz_gpt2``."""
        return path.is_dir() and (path / CONFIG_FILE).is_file() and model_type(path) in cls.model_types

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> BiasGPTAdapter:
        return load_biasviz_checkpoint(path, scheme, attn_scale=options.get("attn_scale"))

    def attention(self, layer: int) -> nn.Module:
        return self.model.blocks[layer].attn

    def scheme_module(self, layer: int) -> nn.Module | None:
        return self.model.blocks[layer].attn.pos_bias

    def rotary(self, layer: int) -> Any:
        """The ``rope`` scheme's layout: half-split over its first ``rotary_dim`` dims (docs/positional.md)."""
        from biasviz.adapters.rotary import RotaryLayout

        module = self.scheme_module(layer)
        if not getattr(module, "rotary", False):
            return None
        return RotaryLayout(interleaved=False, rotary_dims=int(module.rotary_dim))

    @property
    def context_dependent(self) -> bool:
        """As the model's scheme modules say (FoX with a bias-only gate is context-free)."""
        schemes = self.model.schemes()
        return any(s.depends_on_input for s in schemes) if schemes else super().context_dependent

    @contextlib.contextmanager
    def stream(self, layers: list[int], want_bias: bool, sink: Callable[[RowBlock], None],
               want_scores: bool = False) -> Iterator[None]:  # fmt: skip
        """Blocks straight from the hook points, as the attention forms them. A block's bias and scores pass their hook
        points before its weights: each :class:`RowBlock` goes once its weights come, with the call's length, which a
        forward pre-hook of the attention reads from its input (B, T, C)."""
        points = {HOOK_PATTERN: "weights"}
        if want_bias and self.adds_bias:
            points[HOOK_BIAS] = "bias"
        if want_scores:
            points[HOOK_SCORES] = "scores"
        names = [hook_name(layer, point) for point in points for layer in layers]
        waiting: dict[tuple[int, str], torch.Tensor] = {}  # (layer, kind) -> the block under way's bias, scores
        lengths: dict[int, int] = {}  # layer -> T of the forward under way

        def _send(t: torch.Tensor, name: str, row0: int) -> None:
            kind, layer = points[name.rsplit(".", 1)[1]], int(name.split(".")[1])
            if kind != "weights":
                waiting[layer, kind] = t.detach()  # (1 or B, H, rows, row0 + rows)
                return
            sink(RowBlock(layer, 0, row0, t.detach(), scores=waiting.pop((layer, "scores"), None),
                          bias=waiting.pop((layer, "bias"), None), length=lengths[layer]))  # fmt: skip

        def _length(layer: int) -> Callable[..., None]:
            return lambda _mod, args: lengths.__setitem__(layer, args[0].shape[1])  # x: (B, T, C)

        with contextlib.ExitStack() as stack:
            for layer in layers:
                stack.callback(self.attention(layer).register_forward_pre_hook(_length(layer)).remove)
            stack.enter_context(self.stopping_after(layers))
            stack.enter_context(capture(self.model, names, _send))
            yield

    @contextlib.contextmanager
    def keep(self, layers: list[int], bank: Any, tick: Callable[[int], None] | None = None) -> Iterator[None]:
        """q and k from ``hook_q``/``hook_k`` and, with a bias, the attention's input: (B, T, F) per layer."""
        wanted = set(layers)

        def _put(layer: int, name: str) -> Callable[..., None]:
            def hook(_mod: nn.Module, args: tuple, out: torch.Tensor | None = None) -> None:
                bank.put(layer, name, (args[0] if out is None else out).flatten(2))  # (B, T, F)

            return hook

        with contextlib.ExitStack() as stack:
            for layer in range(max(layers) + 1):
                attn = self.attention(layer)
                hooks = []
                if layer in wanted:
                    hooks += [attn.hook_q.register_forward_hook(_put(layer, "q")),
                              attn.hook_k.register_forward_hook(_put(layer, "k"))]  # fmt: skip
                    if attn.adds_bias:  # the scheme's bias is formed again from the layer's input
                        hooks.append(attn.register_forward_pre_hook(_put(layer, "x")))
                if tick is not None:  # at k, which the last layer reaches too
                    hooks.append(attn.hook_k.register_forward_hook(lambda m, a, out: tick(a[0].shape[0])))
                for h in hooks:
                    stack.callback(h.remove)
            # the rows are formed again from q, k and x: the last layer's attention itself is never needed
            stack.enter_context(self.stopping_after(layers, self.attention(max(layers)).hook_k))
            yield

    def rows_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int, want_bias: bool) -> RowBlock:
        attn = self.attention(layer)
        heads, hd = attn.n_head, attn.head_dim
        q = bank.get(layer, "q", sample, r0, r1).view(1, r1 - r0, heads, hd)
        k = bank.get(layer, "k", sample, 0, r1).view(1, r1, heads, hd)
        x = None
        if attn.adds_bias:
            x = bank.get(layer, "x", sample, 0, bank.seq_len(layer, "x"))[None]  # (1, T, C): the whole input
        bias, weights, scores = attn.rows_again(x, q, k, r0, want_bias)
        return RowBlock(layer, sample, r0, weights, scores=scores, bias=bias)

    def bias_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int) -> torch.Tensor | None:
        attn = self.attention(layer)
        if not attn.adds_bias:
            return None
        x = bank.get(layer, "x", sample, 0, bank.seq_len(layer, "x"))[None]
        with torch.no_grad():
            return attn.pos_bias.rows(x)(r0, r1)

    def bias_ends(self, layer: int, bank: Any) -> torch.Tensor | None:
        attn = self.attention(layer)
        scheme = attn.pos_bias if attn.adds_bias else None
        if scheme is None or not scheme.depends_on_input:  # (a bias the same for every input is a table)
            return None
        seq_len = bank.seq_len(layer, "x")
        ends = []
        with torch.no_grad():
            for a in range(bank.samples):  # the terms its forward formed its rows from, one sample at a time
                terms = scheme.score_terms(bank.get(layer, "x", a, 0, seq_len)[None])
                if terms is None or terms.ends is None:
                    return None
                ends.append(terms.ends[0])
        return torch.stack(ends).float()

    def score_scale(self, layer: int) -> float:
        return float(self.attention(layer).scale)


def config_parameters(config: BiasGPTConfig) -> int:
    """At least as many parameters as ``config`` describes: every block's 12 d x d matrices (attention 4, MLP 8)
    and the token table; biases, norms and position tables left out, so the bound never exceeds the truth."""
    return config.n_layer * 12 * config.n_embd**2 + config.vocab_size * config.n_embd


def check_claimed_size(config: BiasGPTConfig, files: list[Path], directory: Path) -> None:
    """Before any weight is read or any layer built: a config that describes a model larger than its weight files
    could hold (2 bytes a parameter at the least), or than this machine's memory, is one clear error.

    A config.json claiming 100,000 layers would otherwise build them all, at random, before the load finds the
    weights missing.
    """
    from biasviz.common.memory import check_fits, size_text

    claimed = config_parameters(config)
    stored = sum(f.stat().st_size for f in files)
    if 2 * claimed > stored + (1 << 20):
        raise BiasvizError(f"{directory / CONFIG_FILE} describes a model of at least {claimed:,} parameters "
                           f"({config.n_layer} layers of width {config.n_embd}), but its weights ({size_text(stored)}) "
                           f"hold at most {stored // 2:,}: the config does not belong to these weights")  # fmt: skip
    check_fits(4 * claimed, f"the model in {directory}", "load it on a machine with more memory")


def load_biasviz_checkpoint(
    path: str | Path,
    scheme: str | None = None,
    *,
    attn_scale: float | None = None,
) -> BiasGPTAdapter:
    """Load a directory written by ``biasviz train`` (config.json + model.safetensors [+ tokenizer.json]).

    ``scheme``, when given, must agree with the checkpoint's; ``attn_scale`` overrides its q.k scale.
    Missing or unexpected weights are an error: a randomly initialised tensor must never pass for a
    trained one.
    """
    directory = Path(path)
    try:
        config = BiasGPTConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise BiasvizError(f"cannot read the biasviz config in {directory}: {exc}") from exc
    if scheme is not None and canonical_name(scheme) != config.scheme:
        raise BiasvizError(
            f"{directory} was trained with scheme '{config.scheme}', not '{canonical_name(scheme)}'; "
            "drop --scheme or pass the checkpoint's own"
        )
    if attn_scale is not None:
        config.attn_scale = float(attn_scale)
    files = parameter_files(directory)
    for file in files:
        if file.suffix == ".safetensors":
            check_safetensors(file)
    check_claimed_size(config, files, directory)
    try:
        model, info = BiasGPTForCausalLM.from_pretrained(
            utf8_path(directory),  # safetensors opens only paths that are valid UTF-8
            config=config,
            dtype=torch.float32,
            local_files_only=True,
            output_loading_info=True,
            use_safetensors=files[0].suffix == ".safetensors",
        )
    except pickle.UnpicklingError as exc:  # a pytorch_model.bin that would run code (read with weights_only)
        raise unsafe_pickle_error(files[0], exc) from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise BiasvizError(f"cannot load the weights in {directory}: {exc}") from exc
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        detail = "; ".join(f"{k.replace('_', ' ')}: {', '.join(map(str, v[:5]))}" for k, v in bad.items())
        raise BiasvizError(f"the weights in {directory} do not match its config.json ({detail})")
    adapter = BiasGPTAdapter(model.eval(), source=str(directory.resolve()), sha256=sha256_files(files),
                             tokenizer=tokenizer_in(directory))  # fmt: skip
    adapter.training = how_trained(directory)
    return adapter
