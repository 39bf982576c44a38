"""What every transformers adapter shares: loading a local directory with eager attention, and hooks
on the library's own attention modules.

Nothing of the libraries' forward passes is re-implemented: a forward pre-hook reads the bias a module
receives, a forward hook the bias it returns and the post-softmax weights. Captured tensors stay on
the device the model runs on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from biasviz.adapters.base import ModelAdapter, RowBlock, WholeCalls
from biasviz.adapters.files import model_type, parameters_sha256, tokenizer_in
from biasviz.common.devices import input_device
from biasviz.common.errors import BiasvizError


def check_scheme(requested: str | None, actual: str, what: str) -> None:
    """A ``--scheme`` given for a transformers model must name the scheme that model really uses."""
    if requested is None:
        return
    from biasviz.schemes import canonical_name

    if canonical_name(requested) != actual:
        raise BiasvizError(f"{what} uses the '{actual}' scheme; --scheme {requested} does not apply (omit --scheme)")


def load_eager(auto_class: Any, path: Path) -> nn.Module:
    """Load a local directory in float32 with eager attention (the only path that forms the weights); with a device
    map (:func:`~biasviz.adapters.device_map.current_placement`) spread as it says, in its precision. Weights that do
    not fit the config are an error (:func:`~biasviz.adapters.loading.load_checked`)."""
    from biasviz.adapters.device_map import current_placement, load_placed
    from biasviz.adapters.loading import load_checked

    placement = current_placement()
    try:
        if placement is not None:
            return load_placed(auto_class, path, placement, attn_implementation="eager")
        model = load_checked(auto_class, path, attn_implementation="eager", dtype=torch.float32)
    except BiasvizError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BiasvizError(f"cannot load the transformers model in {path}: {first}") from exc
    return model.eval()


def directory_facts(path: Path, n_layers: int, n_heads: int) -> dict[str, Any]:
    """Facts every adapter records, read from the directory."""
    return {
        "n_layers": n_layers,
        "n_heads": n_heads,
        "source": str(path.resolve()),
        "sha256": parameters_sha256(path),
        "tokenizer": tokenizer_in(path),
    }


def keys_to_query_rows(row: torch.Tensor, q_len: int) -> torch.Tensor:
    """A bias that depends on the key alone, (N, H, 1, Tk), broadcast to every query row (N, H, Tq, Tk).

    ``expand`` makes a view: one row per head is stored in memory, wherever the model runs.
    """
    row = row.detach()
    return row.expand(row.shape[0], row.shape[1], q_len, row.shape[-1])


class TransformersAdapter(ModelAdapter):
    """Hooks on one attention module per layer; subclasses say where the bias and the weights pass.

    ``_bias_in`` reads the bias from the module's call (forward pre-hook), ``_bias_out`` from what it
    returns (forward hook); ``_weights_out`` picks the post-softmax weights out of the returned tuple.
    """

    model_types: ClassVar[tuple[str, ...]] = ()  # config.json model_type values this adapter opens
    placeable: ClassVar[bool] = True  # loads with a device map (extract --device-map)

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        kwargs.setdefault("vocab_size", int(model.config.vocab_size))
        kwargs.setdefault("config_json", model.config.to_json_string(use_diff=False))
        super().__init__(model, **kwargs)

    @classmethod
    def can_open(cls, path: Path) -> bool:
        return path.is_dir() and (path / "config.json").is_file() and model_type(path) in cls.model_types

    @property
    def context_dependent(self) -> bool:
        return False  # none of these biases depends on the input

    @property
    def device(self) -> torch.device:
        """Where the inputs go: where the first layer runs when a device map spread the model."""
        return input_device(self.model)

    def _bias_in(self, module: nn.Module, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return None

    def _bias_out(self, module: nn.Module, output: Any) -> torch.Tensor | None:
        return None

    def _weights_out(self, output: Any) -> torch.Tensor:
        return output[-1]  # (B, H, T, T)

    def model_inputs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        return {"input_ids": input_ids, "use_cache": False}

    # the scores are no module's output: with them, the forward is traced and the captured layers' attention
    # calls (eager softmax) are formed from the model's own dataflow (biasviz.tracing), with their q and k
    captures_scores = True
    _trace: Any = None

    @contextlib.contextmanager
    def stream(self, layers: list[int], want_bias: bool, sink: Callable[[RowBlock], None],
               want_scores: bool = False) -> Iterator[None]:  # fmt: skip
        """Hooks on the attention modules of ``layers`` only hold each call's whole matrices; they go to ``sink`` once
        the forward is done, one block per layer."""
        captured = WholeCalls()
        handles = []
        try:
            for layer in layers:
                module = self.attention(layer)

                def pre_hook(mod: nn.Module, args: tuple, kwargs: dict, layer: int = layer) -> None:
                    if self._trace is not None:  # the attention call this module makes next: formed, with its scores
                        self._trace.layers.append(len(self._trace.calls))
                    if not want_bias:
                        return
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
                    captured.weights[layer] = weights.detach()  # (B, H, T, T), left on its device
                    call = self._trace.calls[-1] if self._trace is not None and self._trace.calls else None
                    if call is not None and call.scores is not None:
                        captured.scores[layer] = call.scores
                        if call.q is not None and call.k is not None and call.scale is not None and not call.note:
                            captured.operands[layer] = (call.q, call.k, call.scale)

                if want_bias or want_scores:
                    handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
                handles.append(module.register_forward_hook(hook))
            previous = self._scoring, self._sending
            self._scoring, self._sending = want_scores, lambda: captured.send(sink, want_bias)
            try:
                with self.stopping_after(layers):
                    yield
            finally:
                self._scoring, self._sending = previous
        finally:
            for handle in handles:
                handle.remove()

    _scoring = False
    _sending: Callable[[], None] | None = None  # within :meth:`stream`: sends what the hooks held

    def forward(self, input_ids: torch.Tensor) -> None:
        """The model's forward; traced while the scores are streamed (only the streamed layers' calls formed). What the
        hooks held goes to the stream's sink once it is done (outside the trace and inference mode)."""
        if not self._scoring:
            super().forward(input_ids)
        else:
            from biasviz.tracing.mode import Trace

            self._trace = Trace(self.model, [], scores=True)
            try:
                with self._trace:
                    super().forward(input_ids)
            finally:
                self._trace = None
        if self._sending is not None:
            self._sending()
