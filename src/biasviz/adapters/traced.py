"""Any ``torch.nn.Module``, with no adapter: its attention calls are traced (:mod:`biasviz.tracing`).

"Layers" here are attention calls in the order the model makes them (call L is layer L in a plain
decoder). Their number and heads are learned from one traced pass over the first sample (the probe),
in which nothing is formed; extraction then forms only the calls asked for, and stops the forward
after the last of them, as the hook-based adapters do.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from biasviz.adapters.base import ModelAdapter, RowBlock, WholeCalls, refuse_meta
from biasviz.adapters.kept_calls import FormsKeptCallsAgain, KeptCalls
from biasviz.adapters.probe_reads import last_asked, unread_after
from biasviz.common.devices import device_mapped, input_device
from biasviz.common.errors import AttendsPastQuery, BiasvizError, past_query_said
from biasviz.store.format import CALL_MODULES
from biasviz.tracing import AttentionCall, Trace
from biasviz.tracing.calls import FORMED_BEFORE
from biasviz.tracing.owners import call_owners, shared_owners

CAPTURED = "captured"  # the scheme recorded when the user names none: the bias is what the calls added
PROBE_TOKENS = 64  # the probe pass reads this many tokens of the first sample


def module_sha256(model: nn.Module) -> str:
    """SHA-256 over the module's named parameters and buffers (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _vocab_size(model: nn.Module) -> int | None:
    """The vocabulary the token ids are checked against: the config's, else the first embedding table's."""
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "vocab_size", None), int):
        return int(config.vocab_size)
    first = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return None if first is None else int(first.num_embeddings)


def _max_length(model: nn.Module) -> int | None:
    """Learned absolute positions end at the table's size (GPT-2's ``n_positions``); otherwise no limit."""
    n = getattr(getattr(model, "config", None), "n_positions", None)
    return n if isinstance(n, int) else None


class TracedAdapter(FormsKeptCallsAgain, ModelAdapter):
    """A module whose attention calls (SDPA, flex_attention, torch's layers, eager softmax) are traced; layers are
    call indices."""

    def __init__(self, model: nn.Module, *, forward: Callable[[torch.Tensor], Any] | None = None,
                 scheme: str | None = None, source: str = "", sha256: str = "", tokenizer: Any = None,
                 config_json: str = "", name: str | None = None) -> None:  # fmt: skip
        """``scheme``: the user's name for the bias (the registry may know it); else ``name`` (a model directory's
        architecture), else ``captured``: what the file records and its figures are named by."""
        if not (device_mapped(model) and sha256):  # a device map's offloaded weights sit on meta between calls
            refuse_meta(model, source or _describe(model))  # before anything reads its weights (the hash below)
        super().__init__(
            model, scheme=scheme or name or CAPTURED, n_layers=0, n_heads=0, source=source or _describe(model),
            sha256=sha256 or module_sha256(model), max_length=_max_length(model), tokenizer=tokenizer,
            vocab_size=_vocab_size(model), config_json=config_json,
        )  # fmt: skip
        self.architecture = type(model).__name__
        self._scheme_given = scheme is not None and scheme != CAPTURED
        self._call_model = forward if forward is not None else model
        self.calls: list[AttentionCall] = []  # from the probe
        self.call_modules: list[str] = []  # the module that made each call, by name (tracing.owners)
        self._probed = 0  # the tokens the probe read: what every self-attention call attends
        self._chosen: list[AttentionCall] = []
        self._wanted: list[int] = []
        self._streaming: tuple[Callable[[RowBlock], None], bool] | None = None  # within stream: its sink, want_bias
        self._keeping: KeptCalls | None = None  # within keep
        self._kept: KeptCalls | None = None  # the last keep's calls: what forms their rows again
        self._want_scores = False

    # -- facts, from the probe -----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return input_device(self.model)  # a device map's: where the first layer runs

    @property
    def adds_bias(self) -> bool:
        return any(c.adds_bias for c in self._chosen) if self._chosen else self._scheme_flag("adds_bias", True)

    @property
    def context_known(self) -> bool:
        """Whether the file can say if the bias depends on the input: only for a scheme the registry knows."""
        return self._scheme_given

    def file_facts(self) -> dict[str, Any]:
        """The file can say neither whether the bias depends on the input (``biasviz diagnose`` measures it) nor that
        layer L is decoder layer L: the module that made each call, by name, is recorded (``call_modules``)."""
        facts = super().file_facts()
        if self.call_modules:
            facts[CALL_MODULES] = json.dumps(self.call_modules)
        return facts

    def prepare(self, ids: np.ndarray, layers: Any = None) -> None:
        """Run the first sample once, counting the attention calls and reading their heads and masks.

        The probe reads the first ``PROBE_TOKENS`` tokens only (the calls do not depend on the length in
        the models this is for); a model that refuses the shorter input (a mask built for one length) is
        probed at full length. With a device map, the layers after the last of ``layers`` (``--layer``) read
        no weight (:mod:`biasviz.adapters.probe_reads`).
        """
        first = torch.as_tensor(ids[:1])
        last = last_asked(layers) if device_mapped(self.model) else None
        try:
            probe = self._probe(first[:, :PROBE_TOKENS], last)
        except Exception:
            if first.shape[1] <= PROBE_TOKENS:
                raise
            probe = self._probe(first, last)
        if not probe.calls:
            raise BiasvizError(
                f"{self.source} ran without calling scaled_dot_product_attention, flex_attention or torch's "
                "multi_head_attention_forward, and took no softmax over a product of two activations (q.k), so "
                "there is nothing to trace"
            )
        for index, note in probe.notes.items():
            warnings.warn(f"attention call {index}: {note}", stacklevel=2)
        if shared := shared_owners(self.call_modules):  # DiffLlama's two calls a layer: say what a layer is here
            owner, calls = next(iter(shared.items()))
            others = f" (and {len(shared) - 1} other module{'s' * (len(shared) > 2)})" if len(shared) > 1 else ""
            warnings.warn(f"{owner or 'the model'} makes {len(calls)} attention calls a forward{others}: each call is "
                          f"a layer of the file, in the order the model makes them (calls {', '.join(map(str, calls))} "
                          "here); 'biasviz info' shows the module that made each", stacklevel=2)  # fmt: skip
        self.calls = probe.calls
        self.n_layers = len(probe.calls)
        self.n_heads = probe.calls[-1].heads

    def _probe(self, ids: torch.Tensor, last: int | None = None) -> Trace:
        """One pass in which every call is inspected and none formed (extraction has put the model in eval mode), and
        the module that made each is noted (:attr:`call_modules`)."""
        inspect = Trace(self.model, layers=[], inspect=True)
        unread = unread_after(self.model, lambda: len(inspect.calls), last)
        owners = call_owners(self.model, lambda: len(inspect.calls))
        with torch.inference_mode(), one_call_per_layer(self.model), owners as made_by, inspect as probe, unread:
            self._call_model(ids.to(self.device))
        self.call_modules, self._probed = made_by, int(ids.shape[-1])
        return probe

    def resolve_layers(self, spec: int | str | list[int]) -> list[int]:
        if not self.calls:
            raise BiasvizError("the model has not been probed yet (TracedAdapter.prepare)")
        try:
            chosen = super().resolve_layers(spec)
        except BiasvizError:
            raise BiasvizError(f"--layer {spec} out of range: the model makes {self.n_layers} attention calls "
                               f"(0..{self.n_layers - 1}, or -1)") from None  # fmt: skip
        calls = [self.calls[i] for i in chosen]
        for c in calls:  # (before head counts: a call of another shape cannot be taken alone either)
            if c.q_len == c.k_len != self._probed:
                raise BiasvizError(f"attention call {c.index} attends {c.q_len} positions for an input of "
                                   f"{self._probed} tokens: the model adds positions of its own (prompt or memory "
                                   "tokens, a prefix); a file holds one query and one key per token of the input")
            if c.q_len != c.k_len:
                why = ("cross attention, cached keys, or keys of its own: ProphetNet's n-gram streams"
                       if c.q_len == self._probed else f"for an input of {self._probed} tokens: attention in blocks "
                       "of its own, LongT5's local blocks, PEGASUS-X's global tokens")  # fmt: skip
                raise BiasvizError(f"attention call {c.index} attends {c.q_len} queries to {c.k_len} keys ({why}); a "
                                   "file holds square (query, key) matrices of the input's tokens: choose "
                                   "self-attention calls with --layer")  # fmt: skip
        heads = {c.heads for c in calls}
        if len(heads) > 1:
            raise BiasvizError(f"attention calls {chosen} have different head counts {sorted(heads)}; "
                               "extract them one at a time")  # fmt: skip
        self._chosen = calls
        self.n_heads = calls[0].heads
        self.causal = all(c.causal for c in calls)
        return chosen

    def layer_causal(self, layer: int) -> bool:
        """Each call's own rule: an encoder-decoder's encoder and cross attention see every key, its decoder's
        self-attention only the keys up to the query."""
        return bool(self.calls[layer].causal) if 0 <= layer < len(self.calls) else bool(self.causal)

    def _sees_every_key(self, index: int) -> None:
        """Call ``index``, causal in the first sample, attended keys after a query: from here on its rule is every key
        (within its own mask), which :meth:`layer_causal` says to whatever reads the call's blocks."""
        self.calls[index].causal = False
        self.causal = all(c.causal for c in self._chosen)

    def _past_query(self, index: int, start: int) -> AttendsPastQuery:
        """:meth:`_sees_every_key`, and what to raise where the run cannot go on with it (torchrun), said."""
        self._sees_every_key(index)
        return AttendsPastQuery(past_query_said(f"attention call {index}", start))

    def call_note(self, layer: int) -> str | None:
        said = [self.calls[layer].note if 0 <= layer < len(self.calls) else "", super().call_note(layer) or ""]
        return "; ".join(n for n in said if n) or None

    # -- running ---------------------------------------------------------------------------------
    captures_scores = True  # every traced call form keeps its scores (SDPA, flex, eager, torch's MHA layers)

    @contextlib.contextmanager
    def stream(self, layers: list[int], want_bias: bool, sink: Callable[[RowBlock], None],
               want_scores: bool = False) -> Iterator[None]:  # fmt: skip
        """Each forward traces the calls of ``layers``; their whole matrices go to ``sink`` once it is done, one block
        per call."""
        previous = self._streaming, self._wanted, self._want_scores
        self._streaming, self._wanted, self._want_scores = (sink, want_bias), list(layers), want_scores
        try:
            yield
        finally:
            self._streaming, self._wanted, self._want_scores = previous

    # -- forming rows again (summaries linear in samples) ----------------------------------------
    @property
    def replays(self) -> bool:  # type: ignore[override]
        """SDPA calls are formed again from their q and k (RoPE, NoPE: Llama, Qwen, Mistral, Pythia, encoders), and a
        bias in the call (its float mask: ALiBi, T5's buckets) from the one every sample added, kept once (a bias that
        differs by sample would need (T, T) per sample: such a call is streamed); so are eager calls that only add
        terms to scale·q·kᵀ and mask, in float32 (:func:`~biasviz.tracing.eager.eager_operands`), and flex_attention
        calls whose score_mod adds a term (:func:`~biasviz.tracing.flex.flex_operands`: ALiBi, T5 as attention-gym
        writes them), and torch's own layers (``nn.MultiheadAttention``, :func:`~biasviz.tracing.torch_layers.
        mha_operands`)."""
        return bool(self._chosen) and all(c.kind == "sdpa" or c.forms_again for c in self._chosen)

    @contextlib.contextmanager
    def keep(self, layers: list[int], bank: Any, tick: Callable[[int], None] | None = None) -> Iterator[None]:
        """Each :meth:`forward` puts the q and k of the calls ``layers`` into ``bank`` as the calls receive them
        (after any rotation), (B, T, H·E) each, key heads repeated for grouped queries; the calls run unchanged
        (:class:`~biasviz.adapters.kept_calls.KeptCalls`)."""
        previous = self._keeping
        self._keeping = self._kept = KeptCalls(bank, sorted(layers), self.layer_causal,
                                               lambda index: bool(self.calls[index].adds_bias), self._past_query,
                                               tick)  # fmt: skip
        try:
            yield
        finally:
            self._keeping = previous

    # -- running ---------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor) -> None:
        """Run the model with the calls of :meth:`stream` traced; the forward stops after the last of them."""
        if self._keeping is not None:
            self._keeping.batch = int(input_ids.shape[0])
            trace = Trace(self.model, self._keeping.layers, stop=True, keep=self._keeping.keep)
            with torch.inference_mode(), one_call_per_layer(self.model), trace:
                self._call_model(input_ids.to(self.device))
            return
        if self._streaming is None:  # not streaming: a plain pass
            with torch.inference_mode():
                self._call_model(input_ids.to(self.device))
            return
        trace = Trace(self.model, self._wanted, stop=True, scores=self._want_scores)
        with torch.inference_mode(), one_call_per_layer(self.model), trace as t:
            self._call_model(input_ids.to(self.device))
        weights, bias, scores = t.weights, t.bias, t.scores
        calls = {c.index: c for c in t.calls}
        for index in self._wanted:  # each block's reader widens its sums as it sees the call's rule change
            if index in calls and calls[index].causal is False and self.layer_causal(index):
                self._sees_every_key(index)
        held = WholeCalls()
        for index in self._wanted:
            if index not in weights:
                continue  # reported by the caller as nothing captured
            held.weights[index] = weights[index]
            if index in scores:
                held.scores[index] = scores[index]
                call = calls[index]
                formed_before = FORMED_BEFORE in call.note  # softcapping, sink columns: q and k still hold
                if call.q is not None and call.k is not None and call.scale is not None and (not call.note
                                                                                              or formed_before):
                    held.operands[index] = (call.q, call.k, call.scale)
            if index in bias:
                held.bias[index] = bias[index]
            elif self.adds_bias:  # a call with no additive part beside calls with one: it adds 0
                held.bias[index] = torch.zeros(1, *weights[index].shape[1:], device=weights[index].device)
        sink, want_bias = self._streaming
        held.send(sink, want_bias)


@contextlib.contextmanager
def one_call_per_layer(model: nn.Module) -> Iterator[None]:
    """Within the block, biasviz's own attention layers in ``model`` form each matrix in one call.

    Without autograd they attend one block of query rows at a time, each block its own SDPA call; traced,
    call L must be layer L, so here they take the whole (T, T) matrix at once, as before they were blocked.
    """
    modeling = sys.modules.get("biasviz.model.modeling")  # not imported: no such layer can exist
    layers = [] if modeling is None else [m for m in model.modules() if isinstance(m, modeling.Attention)]
    own = [m.__dict__.get("block_elements") for m in layers]
    for m in layers:
        m.block_elements = sys.maxsize
    try:
        yield
    finally:
        for m, value in zip(layers, own, strict=True):
            if value is None:
                m.__dict__.pop("block_elements", None)
            else:
                m.block_elements = value


def _describe(model: nn.Module) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__} (a torch.nn.Module)"
