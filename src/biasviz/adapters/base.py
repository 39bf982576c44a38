"""What extraction needs from a model, whatever its architecture: the :class:`ModelAdapter` interface.

An adapter wraps a loaded model, records the facts :func:`biasviz.extraction.run.extract` writes into the
file (layers, heads, scheme, bias convention, tokenizer, maximum length), knows where each layer's
attention lives and where its additive bias and post-softmax weights pass, and captures them with
forward hooks. Each adapter class also says which paths it can open (:meth:`ModelAdapter.can_open`,
as xarray's backends do), so :func:`biasviz.adapters.load_model` picks one by asking them in turn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from biasviz.adapters.rows import RowBlock
from biasviz.common.errors import BiasvizError, too_long
from biasviz.store.format import KEY_POSITION, RELATIVE  # what a stored bias means
from biasviz.tracing.stop import StopForward, stop_after

__all__ = ["KEY_POSITION", "RELATIVE", "ModelAdapter", "RowBlock", "StopForward", "WholeCalls", "stop_after"]


@dataclass
class WholeCalls:
    """What hooks that see each call's whole matrix hold of one forward, by layer, until it is done and they are sent
    (:meth:`send`): bias (1 or B, H, T, T), weights and scores (B, H, T, T), and the call's q, k (B, H, T, hd) and
    scale as it received them."""

    bias: dict[int, torch.Tensor] = field(default_factory=dict)
    weights: dict[int, torch.Tensor] = field(default_factory=dict)
    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    operands: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = field(default_factory=dict)

    def send(self, sink: Callable[[RowBlock], None], want_bias: bool) -> None:
        """One block per layer, r0 = 0 and keys = T, the weights as formed and the cells the call masked NaN in its
        scores (or bias) (:attr:`RowBlock.marked`); then nothing is held."""
        for layer in sorted(self.weights):
            q, k, scale = self.operands.get(layer, (None, None, None))
            sink(RowBlock(layer, 0, 0, self.weights[layer], scores=self.scores.get(layer),
                          bias=self.bias.get(layer) if want_bias else None,
                          marked=self.scores.get(layer, self.bias.get(layer)), q=q,
                          k=None if k is None else k * scale,
                          scale=None if scale is None else float(scale)))  # fmt: skip
        for held in (self.bias, self.weights, self.scores, self.operands):
            held.clear()


def refuse_meta(model: Any, source: str) -> None:
    """Refuse a model with a weight on the meta device (shapes, no values), naming it: nothing can be computed."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_meta:
            raise BiasvizError(
                f"{source}: weight '{name}' is on the meta device (shapes, no values: a model built under "
                "torch.device('meta') or accelerate's init_empty_weights); load its weights first (to_empty() "
                "and load_state_dict(), or from_pretrained())"
            )


class ModelAdapter:
    """Base class: a model plus everything extraction reads about it.

    Subclasses set the class attributes, implement :meth:`attention` and :meth:`stream`, and, to be
    found by ``--model``, :meth:`can_open` and :meth:`open`. The forward pass (stopping after the last
    captured layer) is the same for all. An adapter that can also form its rows again from what a forward kept is a
    :class:`~biasviz.adapters.again.FormsRowsAgain` too.
    """

    architecture: str = ""  # 'biasviz-gpt2', 'nanogpt', 'bloom', 'mpt', 'falcon', 't5-encoder', ...
    bias_convention: str = RELATIVE
    causal: bool = True  # False: every (i, j) cell is used (a T5 encoder); none is masked in the file
    accepts_attn_scale: ClassVar[bool] = False  # --no-scale applies
    parts: ClassVar[tuple[str, ...]] = ()  # --part choices (encoder-decoder models)

    def __init__(
        self,
        model: nn.Module,
        *,
        scheme: str,
        n_layers: int,
        n_heads: int,
        source: str,
        sha256: str = "",
        max_length: int | None = None,
        tokenizer: Any = None,
        vocab_size: int | None = None,
        config_json: str = "",
    ) -> None:
        self.model = model
        self.scheme = scheme
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.source = source
        self.sha256 = sha256
        self.max_length = max_length  # None: any length (relative schemes)
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer or None
        self.vocab_size = vocab_size
        self.config_json = config_json  # the model's configuration, for the file's provenance
        self.training: dict[str, Any] | None = None  # how biasviz trained it (training.json), where it says
        self._stop_at: nn.Module | None = None  # forward ends once this module has run

    # -- finding and opening ---------------------------------------------------------------------
    @classmethod
    def can_open(cls, path: Path) -> bool:
        """Whether ``path`` (an existing file or directory) is something this adapter loads."""
        return False

    @classmethod
    def open(cls, path: Path, scheme: str | None = None, **options: Any) -> ModelAdapter:
        """Load ``path``; ``options`` are ``attn_scale`` (if :attr:`accepts_attn_scale`) and ``part``."""
        raise NotImplementedError

    # -- facts -----------------------------------------------------------------------------------
    @property
    def adds_bias(self) -> bool:
        """False for schemes without an additive bias (learned positions, NoPE): no ``bias`` dataset."""
        return self._scheme_flag("adds_bias", default=True)

    @property
    def context_dependent(self) -> bool:
        """Whether the bias changes with the input (CABLE); from the scheme registry."""
        return self._scheme_flag("context_dependent", default=False)

    def file_facts(self) -> dict[str, Any]:
        """Root attributes only this adapter can give (docs/hdf5.md): that the file cannot say whether the bias depends
        on the input, where it cannot (a traced model: ``biasviz diagnose`` measures it)."""
        return {} if getattr(self, "context_known", True) else {"context_dependent_known": False}

    def _scheme_flag(self, name: str, default: bool) -> bool:
        from biasviz.schemes import info

        try:
            return bool(getattr(info(self.scheme), name))
        except BiasvizError:  # a scheme the registry does not know (recorded by name only)
            return default

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> ModelAdapter:
        self.model.to(device)
        return self

    def check_length(self, seq_len: int) -> None:
        """Learned absolute positions end at the table's size; relative schemes take any length."""
        if self.max_length is not None and seq_len > self.max_length:
            raise too_long(self.scheme, self.max_length, seq_len, what="--seq-len")

    def prepare(self, ids: Any, layers: Any = None) -> None:
        """Learn what only a forward pass tells (a traced model's attention calls) from the first sample; ``layers``
        (``--layer`` as given) says which calls will be asked for."""

    def layer_causal(self, layer: int) -> bool:
        """Whether ``layer`` attends causally; one rule for every layer unless the model's calls differ."""
        return bool(self.causal)

    def resolve_layers(self, spec: int | str | list[int]) -> list[int]:
        """``-1`` (last), an index, a list, or ``"all"`` -> sorted 0-based layer indices."""
        if spec == "all":
            return list(range(self.n_layers))
        items = spec if isinstance(spec, list) else [int(spec)]
        out = []
        for layer in items:
            idx = layer + self.n_layers if layer < 0 else layer
            if not 0 <= idx < self.n_layers:
                raise BiasvizError(
                    f"--layer {layer} out of range: the model has {self.n_layers} layers "
                    f"(0..{self.n_layers - 1}, or -1)"
                )
            out.append(idx)
        return sorted(set(out))

    # -- where attention lives, and running the model --------------------------------------------
    def attention(self, layer: int) -> nn.Module:
        """The attention module of ``layer``: the forward pass may stop once it has run."""
        raise NotImplementedError

    def scheme_module(self, layer: int) -> nn.Module | None:
        """The module that computes ``layer``'s bias on its own, ``(x, Tq, Tk) -> (1 or B, H, Tq, Tk)``,
        where the model has one (``extract --bias-only``); None where the bias is built inside the attention."""
        return None

    captures_scores: ClassVar[bool] = False  # True: :meth:`stream` sends the scores when asked

    @contextlib.contextmanager
    def stream(self, layers: list[int], want_bias: bool, sink: Callable[[RowBlock], None],
               want_scores: bool = False) -> Iterator[None]:  # fmt: skip
        """Within the block, each :meth:`forward` sends ``layers``' rows to ``sink`` as :class:`RowBlock` s of the
        batch under way; every block of a forward has been sent when it returns.

        The one way what a forward computed leaves the model: a summary reduces each block as it comes (no (H, T, T)
        tensor where the model forms none), a full file lays them together
        (:func:`biasviz.extraction.full_matrices.full_matrices`). Adapters whose models form blocks of rows send them
        as they come; those whose hooks see a call's whole matrix send it as one block (r0 = 0, keys = T) once the
        forward is done, with :attr:`RowBlock.marked`. With the scores (for adapters that
        :attr:`captures_scores`), a call's q and k go too (k multiplied by the call's scale), where the adapter knows
        them (docs/positional.md's positional logits are made of them). Implementations wrap their hooks in
        :meth:`stopping_after` so that :meth:`forward` stops early.
        """
        raise NotImplementedError
        yield  # pragma: no cover

    def rotary(self, layer: int) -> Any:
        """How ``layer``'s call pairs the dims it rotates (:class:`biasviz.adapters.rotary.RotaryLayout`), as the
        model's own rotary module says, where the call does rotate (:func:`~biasviz.adapters.rotary.rotates`: a
        module the model holds but never applies, Falcon's with ALiBi, is no rotation); None where it has none or
        the call rotates nothing (docs/position-measures.md's frequency measures need it)."""
        from biasviz.adapters.rotary import find_rotary, rotating_calls

        layout = find_rotary(self.model)
        if layout is None:
            return None
        if "_rotates" not in self.__dict__:
            self._rotates = rotating_calls(self)
        return layout if self._rotates.get(layer, True) else None

    def call_note(self, layer: int) -> str | None:
        """What ``layer``'s call did beyond c·q·kᵀ + b (a softcap, sink columns), as its trace says, or that it
        rotates nothing though the model holds a rotary module; None: nothing."""
        from biasviz.adapters.rotary import NOT_ROTATED, find_rotary, rotary_module, unread_rotary

        if self.__dict__.get("_rotates", {}).get(layer) is False:
            return NOT_ROTATED
        held = rotary_module(self.model) if isinstance(self.model, torch.nn.Module) else None
        if held is not None and find_rotary(self.model) is None:  # a rotation the measures cannot split
            return unread_rotary(held)
        return None

    @contextlib.contextmanager
    def stopping_after(self, layers: list[int], module: nn.Module | None = None) -> Iterator[None]:
        """Within the block, :meth:`forward` ends after the attention of the last of ``layers``, or after ``module``
        (a point within it past which nothing is wanted)."""
        previous, self._stop_at = self._stop_at, self.attention(max(layers)) if module is None else module
        try:
            yield
        finally:
            self._stop_at = previous

    def model_inputs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        """The keyword arguments of the model's call for (B, T) token ids."""
        return {"input_ids": input_ids}

    def forward(self, input_ids: torch.Tensor) -> None:
        """Run the model on (B, T) token ids without gradients; the hooks keep what is needed.

        Inside :meth:`stream` the pass ends once the last captured attention module has run (inside
        :meth:`keep`, where an adapter says so, earlier: at the point past which nothing it keeps is formed): later
        layers and the (T, V) logits cannot change what was captured, and at long lengths the logits
        alone cost more memory than a layer.
        """
        with torch.inference_mode(), stop_after(self._stop_at):
            self.model(**self.model_inputs(input_ids.to(self.device)))
