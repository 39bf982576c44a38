"""What every transformers adapter shares: loading a local directory with eager attention, and hooks
on the library's own attention modules.

Nothing of the libraries' forward passes is re-implemented: a forward pre-hook reads the bias a module
receives, a forward hook the bias it returns and the post-softmax weights. Captured tensors stay on
the device the model runs on. For a summary, each module's one attention call (eager q.kᵀ, + bias, softmax) is traced
instead and its q and k kept (:class:`~biasviz.adapters.kept_calls.KeptCalls`), so that its rows are formed again block
by block, with no (H, T, T) tensor per layer, where the call is nothing more (a probe of the first sample says so).
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
from biasviz.adapters.kept_calls import FormsKeptCallsAgain, KeptCalls
from biasviz.adapters.traced import PROBE_TOKENS
from biasviz.common.devices import input_device
from biasviz.common.errors import AttendsPastQuery, BiasvizError, past_query_said


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


class TransformersAdapter(FormsKeptCallsAgain, ModelAdapter):
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
        self._first: torch.Tensor | None = None  # the probe's tokens, from prepare
        self._asked: Any = None  # the layers prepare was told of
        self._probed: dict[int, Any] | None = None  # per layer: its module's one call in the probe
        self._keeping: tuple[KeptCalls, dict[int, int]] | None = None  # within keep: its calls, call index -> layer
        self._kept: KeptCalls | None = None  # the last keep's calls: what forms their rows again
        self._every_key: set[int] = set()  # layers found to attend keys after a query

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

    # -- forming rows again (summaries linear in samples) ----------------------------------------
    def prepare(self, ids: Any, layers: Any = None) -> None:
        """The first sample's first tokens, for the probe :attr:`replays` runs when a summary asks."""
        self._first = torch.as_tensor(ids[:1, :PROBE_TOKENS])
        self._asked, self._probed, self._every_key = -1 if layers is None else layers, None, set()

    def _probe(self) -> dict[int, Any]:
        """Each asked layer's attention call, as one pass over the probe's tokens shows it (nothing formed), where its
        module made exactly one: whether it is q.kᵀ scaled, plus terms, masked, in float32, and adds a bias."""
        if self._probed is not None or self._first is None:
            return self._probed or {}
        from biasviz.tracing import Trace

        asked = self.resolve_layers(self._asked)
        spans: dict[int, list[int]] = {}
        trace = Trace(self.model, layers=[], inspect=True)
        handles = []
        for layer in asked:
            module = self.attention(layer)
            handles.append(module.register_forward_pre_hook(
                lambda *_, layer=layer: spans.setdefault(layer, []).append(len(trace.calls))))  # fmt: skip
            handles.append(module.register_forward_hook(lambda *_, layer=layer: spans[layer].append(len(trace.calls))))
        try:
            with self.stopping_after(asked), trace:
                ModelAdapter.forward(self, self._first)
        except Exception:  # a model that refuses the probe: its rows are streamed, as they always were
            spans = {}
        finally:
            for handle in handles:
                handle.remove()
        self._probed = {layer: trace.calls[a] for layer, (a, b) in spans.items() if b - a == 1}
        return self._probed

    @property
    def replays(self) -> bool:  # type: ignore[override]
        """Whether every asked layer's call is scale·q·kᵀ plus terms, under a mask, in float32 (the probe says): then a
        summary forms its rows again from the q and k a forward kept, and the one bias every sample added."""
        calls = self._probe()
        return bool(calls) and all(
            (c := calls.get(layer)) is not None and c.forms_again and c.q_len == c.k_len
            for layer in self.resolve_layers(self._asked)
        )

    def layer_causal(self, layer: int) -> bool:
        return bool(self.causal) and layer not in self._every_key

    def _past_query(self, layer: int, start: int) -> AttendsPastQuery:
        """Layer ``layer``, causal by the model's rule, attended keys after a query in the batch of sample ``start``:
        from here on it is taken as one that sees every key (within its own mask); what to raise, said."""
        self._every_key.add(layer)
        return AttendsPastQuery(past_query_said(f"layer {layer}", start))

    @contextlib.contextmanager
    def keep(self, layers: list[int], bank: Any, tick: Callable[[int], None] | None = None) -> Iterator[None]:
        """Each :meth:`forward` traces the one call of each module of ``layers`` and puts its q and k into ``bank``
        (:class:`~biasviz.adapters.kept_calls.KeptCalls`); ``tick(batch)`` as each layer's attention has run."""
        calls = self._probe()
        kept = KeptCalls(bank, sorted(layers), self.layer_causal, lambda layer: bool(calls[layer].adds_bias),
                         self._past_query)  # fmt: skip
        layer_of: dict[int, int] = {}  # the forward under way's call index -> layer
        handles = []

        def asked(mod: nn.Module, args: tuple, layer: int) -> None:
            assert self._trace is not None
            layer_of[len(self._trace.calls)] = layer
            self._trace.layers.append(len(self._trace.calls))

        for layer in range(max(layers) + 1):
            module = self.attention(layer)
            if layer in layers:
                handles.append(module.register_forward_pre_hook(lambda mod, args, layer=layer: asked(mod, args, layer)))
            if tick is not None:
                handles.append(module.register_forward_hook(lambda *_: tick(kept.batch)))
        previous, self._keeping, self._kept = self._keeping, (kept, layer_of), kept
        try:
            with self.stopping_after(layers):
                yield
        finally:
            self._keeping = previous
            for handle in handles:
                handle.remove()

    def forward(self, input_ids: torch.Tensor) -> None:
        """The model's forward; traced while the scores are streamed (only the streamed layers' calls formed). What the
        hooks held goes to the stream's sink once it is done (outside the trace and inference mode)."""
        if self._keeping is not None:  # each asked module's call goes to the keeping calls, by its layer
            from biasviz.tracing import Trace

            kept, layer_of = self._keeping
            kept.batch = int(input_ids.shape[0])
            layer_of.clear()
            self._trace = Trace(self.model, [], keep=lambda index, ops: None if ops is None
                                else kept.keep(layer_of[index], ops))  # fmt: skip
            try:
                with self._trace:
                    super().forward(input_ids)
            finally:
                self._trace = None
            return
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
