"""Any ``torch.nn.Module``, with no adapter: its attention calls are traced (:mod:`biasviz.tracing`).

"Layers" here are attention calls in the order the model makes them (call L is layer L in a plain
decoder). Their number and heads are learned from one traced pass over the first sample (the probe),
in which nothing is formed; extraction then forms only the calls asked for, and stops the forward
after the last of them, as the hook-based adapters do.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from biasviz.adapters.again import MASK_DIGEST, SAMPLE_CELLS, FormsRowsAgain
from biasviz.adapters.base import ModelAdapter, RowBlock, WholeCalls, refuse_meta
from biasviz.adapters.kept_calls import KeptCall, added_bias, own_cells
from biasviz.adapters.probe_reads import last_asked, unread_after
from biasviz.common.devices import device_mapped, input_device
from biasviz.common.errors import AttendsPastQuery, BiasvizError, MasksDifferBySample
from biasviz.tracing import AttentionCall, Trace
from biasviz.tracing.calls import FORMED_BEFORE, SdpaOperands, _is_causal, formed_rows, repeat_kv

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


class TracedAdapter(FormsRowsAgain, ModelAdapter):
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
        self._chosen: list[AttentionCall] = []
        self._wanted: list[int] = []
        self._streaming: tuple[Callable[[RowBlock], None], bool] | None = None  # within stream: its sink, want_bias
        self._keeping: _Keeping | None = None
        self._want_scores = False
        self._formed: dict[int, KeptCall] = {}  # per call kept for a summary: what forms its rows again
        self._by_sample: set[int] = set()  # calls whose samples are masked differently: each one's cells banked
        self._groups: dict[int, int] = {}  # per call kept: query heads per key head (its k banked repeated)
        self._biases: dict[int, torch.Tensor] = {}  # per call kept that adds a bias: the one every sample added

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
        self.calls = probe.calls
        self.n_layers = len(probe.calls)
        self.n_heads = probe.calls[-1].heads

    def _probe(self, ids: torch.Tensor, last: int | None = None) -> Trace:
        """One pass in which every call is inspected and none formed (extraction has put the model in eval mode)."""
        inspect = Trace(self.model, layers=[], inspect=True)
        unread = unread_after(self.model, lambda: len(inspect.calls), last)
        with torch.inference_mode(), one_call_per_layer(self.model), inspect as probe, unread:
            self._call_model(ids.to(self.device))
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
        heads = {c.heads for c in calls}
        if len(heads) > 1:
            raise BiasvizError(f"attention calls {chosen} have different head counts {sorted(heads)}; "
                               "extract them one at a time")  # fmt: skip
        for c in calls:
            if c.q_len != c.k_len:
                raise BiasvizError(f"attention call {c.index} attends {c.q_len} queries to {c.k_len} keys (cross- or "
                                   "cached attention); a file holds square (query, key) matrices: choose "
                                   "self-attention calls with --layer")  # fmt: skip
        self._chosen = calls
        self.n_heads = calls[0].heads
        self.causal = all(c.causal for c in calls)
        return chosen

    def layer_causal(self, layer: int) -> bool:
        """Each call's own rule: an encoder-decoder's encoder and cross attention see every key, its decoder's
        self-attention only the keys up to the query."""
        return bool(self.calls[layer].causal) if 0 <= layer < len(self.calls) else bool(self.causal)

    def _past_query(self, index: int, where: str) -> AttendsPastQuery:
        """Call ``index``, causal in the first sample, attended keys after a query ``where``: from here on its rule is
        every key (within its own mask), for whatever runs again; what to raise, said."""
        self.calls[index].causal = False
        self.causal = all(c.causal for c in self._chosen)
        return AttendsPastQuery(f"attention call {index} attended keys after a query {where}, though the first "
                                "sample's call attended none (a prefix seen both ways, or a padded query that the "
                                "model's mask gives every key, say): its cells are taken as a call's that sees every "
                                "key, within its own mask")  # fmt: skip

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
        differs by sample would need (T, T) per sample: such a call is streamed)."""
        return bool(self._chosen) and all(c.kind == "sdpa" for c in self._chosen)

    @property
    def fused_rows(self) -> bool:  # type: ignore[override]
        """A call formed again is c·q·kᵀ under its one mask, no bias: what the fused kernels form."""
        return self.replays

    @contextlib.contextmanager
    def keep(self, layers: list[int], bank: Any, tick: Callable[[int], None] | None = None) -> Iterator[None]:
        """Each :meth:`forward` puts the q and k of the calls ``layers`` into ``bank`` as the calls receive them
        (after any rotation), (B, T, H·E) each, key heads repeated for grouped queries; the calls run unchanged."""
        previous = self._keeping
        self._keeping, self._formed, self._by_sample = _Keeping(bank, sorted(layers), tick), {}, set()
        self._biases = {}
        try:
            yield
        finally:
            self._keeping = previous

    def _keep_call(self, index: int, ops: SdpaOperands | None) -> None:
        keeping = self._keeping
        assert keeping is not None
        if keeping.tick is not None:
            keeping.tick(int(ops.q.shape[0]) if ops is not None else keeping.batch)
        if ops is None:
            return
        if self.layer_causal(index) and not _is_causal(ops.kept):
            raise self._past_query(index, f"for sample {keeping.bank.start} or one of its batch")
        if self.calls[index].adds_bias:  # the first sample's call added one
            self._keep_bias(index, ops, keeping.bank.start)
        elif ops.additive is not None:
            raise BiasvizError(f"attention call {index} added a bias for sample {keeping.bank.start} though it added "
                               "none on the first: the model's bias depends on the input; summarise it with "
                               "--resolution equal to --seq-len and --batch-size covering every sample")  # fmt: skip
        self._keep_cells(index, ops, keeping.bank)
        heads = ops.q.shape[1]
        self._groups[index] = heads // ops.k.shape[1]
        keeping.bank.put(index, "q", ops.q.transpose(1, 2).flatten(2))  # (B, T, H·E)
        keeping.bank.put(index, "k", repeat_kv(ops.k, heads).transpose(1, 2).flatten(2))

    def _keep_bias(self, index: int, ops: SdpaOperands, start: int) -> None:
        """The bias call ``index`` adds, over the cells each sample attends (0 elsewhere): kept once, from the first
        sample, and every later sample's compared with it, exactly; one that differs starts the summary again,
        streamed (rows formed again add one bias to every sample)."""
        bias = added_bias(ops)
        first = self._biases.get(index)
        if first is None:  # (one copy, not one a batch)
            first = self._biases[index] = bias[:1].clone()
        if not bool((bias == first).all()):
            raise MasksDifferBySample(f"attention call {index} added another bias for sample {start} or one of its "
                                      "batch than for the first")  # fmt: skip

    def _keep_cells(self, index: int, ops: SdpaOperands, bank: Any) -> None:
        """What call ``index`` attended to for the batch: one mask while every sample has the same (kept once);
        from the first sample masked otherwise (padding, packed documents) on, every sample's own cells, one set for
        all heads or, where its heads attend cells of their own, one a head, in the bank beside its q and k (those
        before by the one mask they had)."""
        if index in self._by_sample:
            if ops.scale != self._formed[index].scale:
                raise _scale_differs(index, ops.scale, self._formed[index].scale, bank.start)
            bank.put_cells(index, SAMPLE_CELLS, own_cells(ops.kept, ops.q.shape[0]))
            return
        try:
            kept: KeptCall | None = KeptCall.of(ops, self.layer_causal(index))
        except MasksDifferBySample:  # within the batch
            kept = None
        first = self._formed.setdefault(index, kept or KeptCall(ops.scale, None, self.layer_causal(index)))
        if kept is not None and first.same(kept):
            if not bank.cells_by_sample:  # torchrun: the process's one mask goes with its samples, compared once joined
                bank.put(index, MASK_DIGEST, first.digest.expand(ops.q.shape[0], 1, -1))
            return
        if first.scale != ops.scale:
            raise _scale_differs(index, ops.scale, first.scale, bank.start)
        if not bank.cells_by_sample:  # torchrun's processes meet in one bank
            raise BiasvizError(f"attention call {index} masked other cells for sample {bank.start} than for the "
                               "first (padding or packed documents): under torchrun a summary takes one mask for "
                               "every sample; run it in one process")  # fmt: skip
        if index in self._biases:  # a bias is summarised over each sample's own cells as the model streams them
            raise MasksDifferBySample(f"attention call {index} added a bias and masked other cells for sample "
                                      f"{bank.start} than for the first")  # fmt: skip
        own = own_cells(ops.kept, ops.q.shape[0])
        t = own.shape[-1]
        if bank.start:  # the samples before: the one mask they had, a sample at a time (never N·T² at once)
            before = own_cells(first.rows(0, t, own.device, t), 1)
            for a in range(bank.start):
                bank.put_cells(index, SAMPLE_CELLS, before, at=a)
        bank.put_cells(index, SAMPLE_CELLS, own)
        self._by_sample.add(index)

    def rows_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int, want_bias: bool) -> RowBlock:
        """Rows r0 .. r1 - 1 of call ``layer`` for one sample, formed as a traced call forms them (float32), against
        keys 0 .. r1 - 1, or every key where the call sees keys after its query."""
        kept = self._formed[layer]
        heads = self.n_heads
        keys = r1 if self.layer_causal(layer) else bank.seq_len(layer, "k")
        q = bank.get(layer, "q", sample, r0, r1).view(1, r1 - r0, heads, -1).transpose(1, 2)
        k = bank.get(layer, "k", sample, 0, keys).view(1, keys, heads, -1).transpose(1, 2)
        bias = self._biases.get(layer)
        if bias is not None:  # (1, H, rows, keys): the one every sample added
            bias = bias[..., r0:r1, :keys].to(q.device).expand(1, heads, -1, -1)
        own = None
        if layer in self._by_sample:  # this sample's own cells, (1, 1 or H, rows, keys)
            own = bank.get_cells(layer, SAMPLE_CELLS, sample, r0, r1, keys).to(q.device)[None]
        cells = own if own is not None else kept.rows(r0, r1, q.device, keys)
        scores, weights = formed_rows(q, k, kept.scale, cells, bias)
        return RowBlock(layer, sample, r0, weights, scores=scores, bias=bias if want_bias else None, attended=own)

    def score_scale(self, layer: int) -> float:
        return self._formed[layer].scale

    def key_repeats(self, layer: int) -> int:
        return self._groups.get(layer, 1)

    def attended(self, layer: int) -> torch.Tensor | None:
        return None if layer in self._by_sample else self._formed[layer].mask

    # -- running ---------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor) -> None:
        """Run the model with the calls of :meth:`stream` traced; the forward stops after the last of them."""
        if self._keeping is not None:
            self._keeping.batch = int(input_ids.shape[0])
            trace = Trace(self.model, self._keeping.layers, stop=True, keep=self._keep_call)
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
        for index in self._wanted:
            if index in calls and calls[index].causal is False and self.layer_causal(index):
                raise self._past_query(index, "for a sample of this batch")
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


@dataclass
class _Keeping:
    """A :meth:`TracedAdapter.keep` under way."""

    bank: Any
    layers: list[int]
    tick: Callable[[int], None] | None
    batch: int = 1


def _scale_differs(index: int, scale: float, first: float, sample: int) -> MasksDifferBySample:
    """Rows formed again take one scale for every sample: a call whose scale changes is streamed instead."""
    return MasksDifferBySample(f"attention call {index} scaled q·k by {scale!r} for sample {sample} or one of its "
                               f"batch, by {first!r} for the first")  # fmt: skip


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
