r"""``biasviz.trace``: intercept every attention call of any PyTorch model while it runs.

A :class:`torch.overrides.TorchFunctionMode` sees each call of
``torch.nn.functional.scaled_dot_product_attention``, of the ``flex_attention`` operator and of
``multi_head_attention_forward`` (``nn.MultiheadAttention`` and the ``nn.Transformer*Layer``\ s) before it
runs, whoever makes it (the user's own module, transformers, x-transformers); attention written out in
eager PyTorch is followed from its q.kᵀ product to its softmax (:mod:`biasviz.tracing.eager`). No module is
patched and no forward is copied. Each call is numbered in the order it runs (call L is layer L in a plain
decoder), and the calls asked for are formed explicitly (:mod:`biasviz.tracing.calls`); the call itself
then runs unchanged, so the model's outputs are exactly what they would be without the trace. A call that
cannot be formed still runs; the reason is in ``Trace.notes``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from biasviz.common.devices import without_autocast
from biasviz.tracing.calls import (
    AttentionCall,
    SdpaOperands,
    packed_groups,
    sdpa_call,
    sdpa_operands,
    unformed,
)
from biasviz.tracing.eager import PRODUCTS, SOFTMAX, EagerTracker, eager_call, softmax_dim
from biasviz.tracing.eager_kept import eager_operands
from biasviz.tracing.flex import flex_call, flex_operands
from biasviz.tracing.provenance import Provenance
from biasviz.tracing.stop import StopForward
from biasviz.tracing.torch_layers import MHA, mha_call, mha_operands

_SDPA = torch.nn.functional.scaled_dot_product_attention
# A trace forms a call with torch operations of its own (q.kᵀ, softmax); a trace around it (a trace inside a
# trace) must not take those for the model's: while any trace of this thread forms, the others let them run.
_FORMING = threading.local()


@contextlib.contextmanager
def _forming() -> Iterator[None]:
    """A trace's own arithmetic: not the model's (see above), and in the operands' precision whatever autocast the
    model runs under."""
    _FORMING.depth = getattr(_FORMING, "depth", 0) + 1
    try:
        with without_autocast():
            yield
    finally:
        _FORMING.depth -= 1


def _others_forming() -> bool:
    return getattr(_FORMING, "depth", 0) > 0


def _kind(func: Any) -> str | None:
    if func is _SDPA:
        return "sdpa"
    if func is MHA:
        return "multi_head_attention"
    if type(func).__name__ == "FlexAttentionHOP" or getattr(func, "_name", None) == "flex_attention":
        return "flex_attention"
    return None


class Trace:
    """The calls one traced block made: ``bias[L]`` and ``weights[L]`` by call index L (0-based).

    ``bias[L]`` is (1 or B, H, Tq, Tk) float32 and present only for calls that add a bias; ``weights[L]``
    is (B, H, Tq, Tk) float32; masked cells are NaN in the bias and 0 in the weights. ``calls`` lists
    every intercepted call (also those not recorded) with its heads, lengths and notes; ``notes[L]`` says why
    a call has no bias (a step that is not additive) or was not formed, and ``sinks[L]`` is the share of
    each query's softmax on attention-sink columns, where the call has them.

    ``keep(index, operands)``: for every call, its SDPA operands where it is one asked for (None otherwise); those
    calls are not formed here but handed over (summaries form their rows again, block by block).
    """

    def __init__(self, model: torch.nn.Module | None = None, layers: Iterable[int] | None = None,
                 *, stop: bool = False, inspect: bool = False, scores: bool = False,
                 keep: Callable[[int, SdpaOperands | None], None] | None = None) -> None:  # fmt: skip
        self.model = model
        self.keep_scores = scores  # the calls asked for keep their scores too (every kind of call)
        self.keep = keep
        self.inspect = inspect  # a probe: calls not recorded still tell whether they add a bias
        self.layers = None if layers is None else sorted({int(x) for x in layers})
        if self.layers is not None and any(x < 0 for x in self.layers):
            raise ValueError("trace(layers=...) takes call indices from 0; the number of calls is known only "
                             "after the forward (biasviz.extract resolves -1)")  # fmt: skip
        self.stop = stop and bool(self.layers)
        self.calls: list[AttentionCall] = []
        self.provenance = Provenance(model)  # which tensors come from the model's parameters (learned tables)
        self.eager = EagerTracker(self.provenance)
        self._stack = contextlib.ExitStack()

    # -- results -----------------------------------------------------------------------------------
    @property
    def bias(self) -> dict[int, torch.Tensor]:
        """(1 or B, H, Tq, Tk) float32 per call that adds a bias: the term added to the scaled scores, masked NaN."""
        return {c.index: c.bias for c in self.calls if c.bias is not None}

    @property
    def weights(self) -> dict[int, torch.Tensor]:
        """(B, H, Tq, Tk) float32 per recorded call: the post-softmax attention weights, masked cells 0."""
        return {c.index: c.weights for c in self.calls if c.weights is not None}

    @property
    def scores(self) -> dict[int, torch.Tensor]:
        """(B, H, Tq, Tk) per call, with ``scores=True``: the softmax's input, masked cells NaN (every kind of call)."""
        return {c.index: c.scores for c in self.calls if c.scores is not None}

    @property
    def sinks(self) -> dict[int, torch.Tensor]:
        """(B, H, Tq) per call with attention sinks: the share of each query's softmax on the sink columns."""
        return {c.index: c.sink for c in self.calls if c.sink is not None}

    @property
    def notes(self) -> dict[int, str]:
        """Per call, why it has no bias (a step that is not additive) or was not formed, where there is a reason."""
        return {c.index: c.note for c in self.calls if c.note}

    def wants(self, index: int) -> bool:
        """Whether call ``index`` is one to form (``layers`` given to :func:`trace`, or every call)."""
        return self.layers is None or index in self.layers

    # -- interception ------------------------------------------------------------------------------
    def intercept(self, kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one attention call (``kind``: sdpa, flex or multi_head_attention) as the model made it, and record
        it; called by the function mode, not by users."""
        index = len(self.calls)
        record = self.wants(index)
        if self.keep is not None and record:
            return self._keep(index, kind, func, args, kwargs)
        if self.keep is not None:
            self.keep(index, None)
        try:
            with _forming():
                if kind == "sdpa":
                    call = sdpa_call(index, args, kwargs, record, self.inspect, groups=packed_groups(),
                                     scores=self.keep_scores, learned=self._learned_mask(args, kwargs))  # fmt: skip
                elif kind == "multi_head_attention":
                    call = mha_call(
                        index, args, kwargs, record, self.inspect, self.provenance.learned, self.keep_scores
                    )
                else:
                    call = flex_call(index, args, kwargs, record, self.inspect, scores=self.keep_scores)
        except Exception as exc:  # a trace never breaks the call it observes: the call runs, the reason is kept
            call = unformed(index, kind, args, kwargs, exc)
        dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0) if kind == "sdpa" else 0.0
        if record and dropout:
            call.note = (call.note + "; " if call.note else "") + f"dropout_p={dropout} in the call: weights " \
                        "recorded before dropout (put the model in eval mode)"  # fmt: skip
        self._append(call)
        return func(*args, **kwargs)

    def _keep(self, index: int, kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call asked for in a keeping trace: its operands go to :attr:`keep` (a flex_attention call's or torch's
        layers' as an SDPA call's: score_mod's additive part, or the float masks added, its bias); nothing is
        formed."""
        assert self.keep is not None
        with _forming():
            if kind == "sdpa":
                ops = sdpa_operands(args, kwargs, packed_groups(), self._learned_mask(args, kwargs))
            elif kind == "multi_head_attention":
                ops = mha_operands(args, kwargs, self.provenance.learned)
            elif (ops := flex_operands(args, kwargs)) is None:
                raise TypeError(f"attention call {index}: its score_mod is not additive, so it cannot be kept")
        self.keep(index, ops)
        self._append(replace(ops.facts(index), kind=kind, forms_again=True))
        return func(*args, **kwargs)

    def _keep_eager(self, index: int, x: torch.Tensor, scores: Any, out: Any) -> Any:
        """A softmax over eager scores in a keeping trace (it has run): the call's operands go to :attr:`keep` where it
        is one asked for (None otherwise), formed as an SDPA call's (:func:`~biasviz.tracing.eager.eager_operands`)."""
        assert self.keep is not None
        if isinstance(out, torch.Tensor):
            self.eager.softmaxed(out)
        if not self.wants(index):  # only counted: its facts, nothing formed
            self.keep(index, None)
            self._append(eager_call(index, x, scores, out, record=False, inspect=False))
            return out
        with _forming():
            ops = eager_operands(x, scores)
        if ops is None:
            raise TypeError(f"attention call {index} is an eager call its q, k and terms cannot form again")
        self.keep(index, ops)
        self._append(replace(ops.facts(index), kind="eager", forms_again=True))
        return out

    def _learned_mask(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return self.provenance.learned(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))

    def _append(self, call: AttentionCall) -> None:
        self.calls.append(call)
        if self.stop and self.layers is not None and call.index >= self.layers[-1]:
            raise StopForward  # everything asked for is recorded: the rest of the forward cannot change it

    def follow(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Any other operation: it runs as written; the trace follows score tensors from product to softmax."""
        name = getattr(func, "__name__", "")
        if not self.eager and name not in PRODUCTS:  # no score tensor in flight: only a product can start one
            out = func(*args, **kwargs)
            with contextlib.suppress(Exception), _forming():
                self.provenance.after(name, args, kwargs, out)
                self.eager.folds.after(name, args, kwargs, out)
            return out
        x = (args[0] if args else kwargs.get("input")) if name in SOFTMAX else None
        scores = self.eager.get(x) if x is not None else None
        if scores is None and isinstance(x, torch.Tensor) and softmax_dim(args, kwargs) in (-1, x.dim() - 1):
            scores = self.eager.lost(x)
        out = func(*args, **kwargs)
        if scores is not None and softmax_dim(args, kwargs) in (-1, x.dim() - 1):
            index = len(self.calls)
            if self.keep is not None:
                return self._keep_eager(index, x, scores, out)
            try:
                with _forming():
                    call = eager_call(index, x, scores, out, self.wants(index), self.inspect, self.keep_scores)
            except Exception as exc:  # never break the model: its softmax has run, the reason is kept
                call = AttentionCall(index, "eager", 1, 1, *x.shape[-2:], note=f"not formed ({type(exc).__name__}: "
                                     f"{exc}); the call ran unchanged")  # fmt: skip
            if isinstance(out, torch.Tensor):
                self.eager.softmaxed(out)  # a product of these weights (with v) is no score tensor
            self._append(call)
            return out
        with contextlib.suppress(Exception), _forming():  # bookkeeping: it must never fail the model's step
            self.provenance.after(name, args, kwargs, out)
            self.eager.folds.after(name, args, kwargs, out)
            self.eager.after(name, args, kwargs, out)
        return out

    def __enter__(self) -> Trace:
        # torch.compile'd code would trace through the mode (or skip it): run it eagerly while traced
        set_stance = getattr(torch.compiler, "set_stance", None)
        if set_stance is not None:
            self._stack.enter_context(set_stance("force_eager"))
        if isinstance(self.model, torch.nn.Module):  # its arguments are the input, whatever their dtype
            hook = self.model.register_forward_pre_hook(self._inputs, with_kwargs=True)
            self._stack.callback(hook.remove)
        self._stack.enter_context(_Interceptor(self))
        return self

    def _inputs(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.provenance.inputs(args, kwargs)

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> bool:
        self._stack.close()
        if exc_type is not None and issubclass(exc_type, StopForward):
            assert exc is not None
            exc.__traceback__ = None  # its frames hold the stopped forward's activations
            return True
        return False


class _Interceptor(TorchFunctionMode):
    """Hands SDPA and flex_attention calls to the trace; everything else runs as it would."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        if _others_forming():  # another trace's own arithmetic (a trace inside this one): not the model's
            return func(*args, **kwargs)
        kind = _kind(func)
        if kind is None:
            return self.trace.follow(func, args, kwargs)
        return self.trace.intercept(kind, func, args, kwargs)


def trace(model: torch.nn.Module | None = None, layers: Iterable[int] | None = None, *, stop: bool = False) -> Trace:
    """Record the bias and weights of every attention call made inside the ``with`` block.

    ``layers`` limits what is formed (call indices from 0; the rest are only counted); ``stop`` ends the
    forward quietly after the last of them, saving the rest of the model (and its memory).

    For example::

        >>> import torch, biasviz
        >>> q = k = v = torch.randn(1, 2, 4, 8)
        >>> with biasviz.trace() as t:
        ...     _ = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> t.weights[0].shape, float(t.weights[0][0, 0, 0, 1])
        (torch.Size([1, 2, 4, 4]), 0.0)
    """
    return Trace(model, layers, stop=stop)
