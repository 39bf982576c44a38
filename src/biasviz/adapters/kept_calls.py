"""What a keeping forward kept of each attention call it was given (q, k, the cells attended, the scale, one bias), and
every sample's rows formed again from it (:class:`KeptCalls`): the one way a traced call, or a hooked module's call,
is formed again.

While every sample has one mask, a call keeps it once (:class:`KeptCall`, with the scale its rows are formed with); from
the first sample masked otherwise (padding, packed documents) on, each sample's own cells go into the bank beside its q
and k (:func:`own_cells`), one set for all heads or, where its heads attend cells of their own, one a head.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from biasviz.adapters.again import MASK_DIGEST, SAMPLE_BIAS, SAMPLE_CELLS, SAMPLE_SINKS, FormsRowsAgain
from biasviz.adapters.kept_bias import KeptBias, added_bias
from biasviz.adapters.rows import RowBlock, plain_cells
from biasviz.common.errors import BiasvizError, MasksDifferBySample
from biasviz.tracing.calls import SdpaOperands, _is_causal, formed_rows, repeat_kv


@dataclass
class KeptCall:
    """What a kept call forms every sample's rows with: its scale and its mask (None: the call's rule, the causal
    triangle or, for a call that sees keys after its query, every cell)."""

    scale: float
    mask: torch.Tensor | None  # (1, 1 or H, Tq, Tk) bool, the cells attended to, where not the call's rule
    causal: bool = True  # the call's rule
    softcap: float | None = None  # c where the softmax takes c·tanh(s / c)

    @classmethod
    def of(cls, ops: SdpaOperands, causal: bool) -> KeptCall:
        kept = ops.kept
        q_len, k_len = kept.shape[-2:]
        if bool((kept == plain_cells(0, q_len, k_len, causal, kept.device)).all()):
            return cls(ops.scale, None, causal, ops.softcap)
        if kept.shape[0] > 1 and not bool((kept == kept[:1]).all()):
            raise MasksDifferBySample("an attention call masked different cells for samples of one batch: a summary "
                                      "forms one mask for every sample")  # fmt: skip
        return cls(ops.scale, kept[:1], causal, ops.softcap)

    @functools.cached_property
    def digest(self) -> torch.Tensor:
        """(1, 32) uint8: the SHA-256 of the scale and mask (None: the call's rule), hashed once per call."""
        rule = b"causal" if self.causal else b"every key"
        mask = rule if self.mask is None else self.mask.contiguous().cpu().numpy().tobytes()
        raw = hashlib.sha256(repr((self.scale, self.softcap)).encode() + mask).digest()
        return torch.tensor(list(raw), dtype=torch.uint8)[None]

    def same(self, other: KeptCall) -> bool:
        if (self.scale, self.softcap) != (other.scale, other.softcap) or (self.mask is None) != (other.mask is None):
            return False
        return self.mask is None or bool(torch.equal(self.mask, other.mask))

    def rows(self, r0: int, r1: int, device: torch.device, keys: int | None = None) -> torch.Tensor:
        """(1, 1 or H, rows, keys) bool: the cells of query rows r0 .. r1 - 1 that are attended to, of keys 0 ..
        ``keys`` - 1 (default r1: a causal call's)."""
        keys = r1 if keys is None else keys
        if self.mask is None:
            return plain_cells(r0, r1 - r0, keys, self.causal, device)
        return self.mask[..., r0:r1, :keys].to(device)


def own_cells(kept: torch.Tensor, batch: int) -> torch.Tensor:
    """(``batch``, 1 or H, T, T) bool: each sample's attended cells of a call from its mask ``kept`` (1 or B, 1 or H,
    T, T): one set for all heads where they agree, one a head where they do not."""
    cells = kept if kept.shape[1] > 1 and not bool((kept == kept[:, :1]).all()) else kept[:, :1]
    return cells.expand(batch, *cells.shape[1:]) if cells.shape[0] == 1 else cells


@dataclass
class KeptCalls:
    """One keeping forward's calls: what each kept in ``bank`` and forms every sample's rows again with.

    ``causal(index)`` is a call's rule as the first sample showed it, ``adds_bias(index)`` whether the first sample's
    call added a bias, ``past_query(index, start)`` what to raise when a causal call attends keys after a query in the
    batch of sample ``start`` (the owner marks it as one that sees every key); ``tick(batch)`` as each call is reached.
    """

    bank: Any
    layers: list[int]
    causal: Callable[[int], bool]
    adds_bias: Callable[[int], bool]
    past_query: Callable[[int, int], Exception]
    tick: Callable[[int], None] | None = None
    batch: int = 1
    formed: dict[int, KeptCall] = field(default_factory=dict)  # per call: what forms its rows again
    by_sample: set[int] = field(default_factory=set)  # calls whose samples are masked differently: cells banked
    groups: dict[int, int] = field(default_factory=dict)  # per call: query heads per key head (k banked repeated)
    biases: dict[int, KeptBias] = field(default_factory=dict)  # per call that adds a bias: the first sample's
    bias_by_sample: set[int] = field(default_factory=set)  # calls whose bias differs by sample: each one's banked
    sinks: dict[int, bool] = field(default_factory=dict)  # per call: whether its softmax runs over sink columns too
    digests: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # torchrun: bias values, hash

    def keep(self, index: int, ops: SdpaOperands | None) -> None:
        """Call ``index`` of the batch under way: its q and k into the bank (after any rotation), (B, T, H·E) each, key
        heads repeated for grouped queries, with its cells and bias checked against the first sample's; None: a call
        not asked for."""
        if self.tick is not None:
            self.tick(int(ops.q.shape[0]) if ops is not None else self.batch)
        if ops is None:
            return
        bank = self.bank
        if self.causal(index) and not _is_causal(ops.kept):
            self._sees_every_key(index)
        if self.adds_bias(index):  # the first sample's call added one
            self._keep_bias(index, ops)
        elif ops.adds:
            raise BiasvizError(f"attention call {index} added a bias for sample {bank.start} though it added none on "
                               "the first: the model's bias depends on the input; summarise it with --resolution "
                               "equal to --seq-len and --batch-size covering every sample")  # fmt: skip
        self._keep_cells(index, ops)
        self._keep_sinks(index, ops)
        heads = ops.q.shape[1]
        self.groups[index] = heads // ops.k.shape[1]
        bank.put(index, "q", ops.q.transpose(1, 2).flatten(2))  # (B, T, H·E)
        bank.put(index, "k", repeat_kv(ops.k, heads).transpose(1, 2).flatten(2))

    def _sees_every_key(self, index: int) -> None:
        """Call ``index``, causal so far, attended keys after a query: from here on it sees every key within its own
        mask (its owner marks it so), and its samples are masked differently, the samples before by the cells they
        attended (:meth:`_keep_cells`), so that nothing runs again. Under torchrun, whose processes join one mask, the
        owner's word is raised."""
        why = self.past_query(index, self.bank.start)
        if not self.bank.cells_by_sample:
            raise why
        warnings.warn(f"{why}; the samples before keep the cells they attended", stacklevel=4)

    def _keep_bias(self, index: int, ops: SdpaOperands) -> None:
        """The bias call ``index`` adds, over the cells each sample attends (0 elsewhere, padding beside a bias
        included): kept once, from the first batch, and every later sample's compared with it on its own cells,
        exactly. From the first sample whose bias differs (BLOOM's positions start after its padding), each sample's
        own bias goes into the bank, in the first one's form (:meth:`_bank_bias`). A bias the call gave in a smaller
        form (:attr:`~biasviz.tracing.calls.SdpaOperands.compact`: a flex_attention call's) is kept and compared in it,
        its cells never formed, unless it differs."""
        if ops.compact is not None:
            compact = ops.compact
            first = self.biases.get(index)
            if first is None:
                self.biases[index] = KeptBias(compact.form, compact.values, compact.q_len)
                return
            if index not in self.bias_by_sample and first.merge(compact):
                return
            ops = ops.dense()  # another bias than the first's: its cells, compared and banked as any call's
        bias = added_bias(ops)
        first = self.biases.get(index)
        if first is None:  # (one copy, not one a batch, in the smallest form the first sample's has)
            first = self.biases[index] = KeptBias.of(bias[:1], ops.kept[:1])
            if bias.shape[0] == ops.kept.shape[0] == 1:  # one bias and mask for the whole batch: just compared
                return
        if index in self.bias_by_sample or not first.take(bias, ops.kept):
            self._bank_bias(index, first, bias, ops)

    def _bank_bias(self, index: int, first: KeptBias, bias: torch.Tensor, ops: SdpaOperands) -> None:
        """Each sample's own bias of call ``index`` (``bias``, over the cells ``ops`` kept), in the form of the first
        sample's (a row of keys, or a table of j - i: H·T or H·(2T - 1) floats a sample, beside its q and k), into the
        bank; the samples before, by the one bias they had. A bias that is not of that form (one of each cell that
        depends on the text, which would bank H·T² floats a sample) turns the summary to streaming from this batch, and
        says so (:mod:`biasviz.extraction.stream_from`);
        under torchrun, whose processes are joined by one bias, a bias that differs is refused."""
        bank, batch = self.bank, ops.q.shape[0]
        differs = MasksDifferBySample(f"attention call {index} added another bias for sample {bank.start} or one of "
                                      "its batch than for the first")  # fmt: skip
        if first.form == "cells" or not bank.cells_by_sample:
            raise differs
        heads = ops.q.shape[1]
        bias = bias.expand(batch, *bias.shape[1:])
        kept = ops.kept.expand(batch, *ops.kept.shape[1:])
        own = KeptBias.shown_by(first.form, bias, kept)  # (B, 1 or H, L)
        if not own.fits(bias, kept):  # (one read for the batch)
            raise differs
        if index not in self.bias_by_sample:
            if bank.start:  # the samples before: the one bias they had (H·T or H·(2T - 1) floats each, at once)
                bank.put(index, SAMPLE_BIAS, first.values.expand(bank.start, heads, -1).transpose(1, 2), at=0)
            self.bias_by_sample.add(index)
        bank.put(index, SAMPLE_BIAS, own.values.expand(batch, heads, -1).transpose(1, 2))  # (B, L, H)

    def _keep_sinks(self, index: int, ops: SdpaOperands) -> None:
        """Each row's sink logit of call ``index`` (GPT-OSS's sink columns beside the keys), (B, T, H) into the bank
        beside q and k: a sample's sink share is the model's, whatever its rows were shifted by."""
        if self.sinks.setdefault(index, ops.sinks is not None) != (ops.sinks is not None):
            raise MasksDifferBySample(f"attention call {index} ran its softmax over sink columns for sample "
                                      f"{self.bank.start} or one of its batch, and not for the first, or the other way")
        if ops.sinks is not None:
            self.bank.put(index, SAMPLE_SINKS, ops.sinks.float().transpose(1, 2))

    def _keep_cells(self, index: int, ops: SdpaOperands) -> None:
        """What call ``index`` attended to for the batch: one mask while every sample has the same (kept once);
        from the first sample masked otherwise (padding, packed documents) on, every sample's own cells, one set for
        all heads or, where its heads attend cells of their own, one a head, in the bank beside its q and k (those
        before by the one mask they had)."""
        bank = self.bank
        if index in self.by_sample:
            if (ops.scale, ops.softcap) != (self.formed[index].scale, self.formed[index].softcap):
                raise _scale_differs(index, ops, self.formed[index], bank.start)
            bank.put_cells(index, SAMPLE_CELLS, own_cells(ops.kept, ops.q.shape[0]))
            return
        try:
            kept: KeptCall | None = KeptCall.of(ops, self.causal(index))
        except MasksDifferBySample:  # within the batch
            kept = None
        if index not in self.formed:
            self.formed[index] = self._shared(kept or KeptCall(ops.scale, None, self.causal(index), ops.softcap))
        first = self.formed[index]
        if kept is not None and first.same(kept):
            if not bank.cells_by_sample:  # torchrun: the process's one mask (and bias) go with its samples, compared
                bank.put(index, MASK_DIGEST, self._digest(index, first).expand(ops.q.shape[0], 1, -1))  # once joined
            return
        if (first.scale, first.softcap) != (ops.scale, ops.softcap):
            raise _scale_differs(index, ops, first, bank.start)
        if not bank.cells_by_sample:  # torchrun's processes meet in one bank
            raise BiasvizError(f"attention call {index} masked other cells for sample {bank.start} than for the "
                               "first (padding or packed documents): under torchrun a summary takes one mask for "
                               "every sample; run it in one process")  # fmt: skip
        own = own_cells(ops.kept, ops.q.shape[0])
        t = own.shape[-1]
        if bank.start:  # the samples before: the one mask they had, a sample at a time (never N·T² at once)
            before = own_cells(first.rows(0, t, own.device, t), 1)
            for a in range(bank.start):
                bank.put_cells(index, SAMPLE_CELLS, before, at=a)
        bank.put_cells(index, SAMPLE_CELLS, own)
        self.by_sample.add(index)

    def _shared(self, call: KeptCall) -> KeptCall:
        """``call``, its mask the very tensor another call kept where the two are equal (every layer of a model with a
        sliding window holds one), else a copy of its own: never a view that holds the whole batch's masks alive
        (B·T² bytes a layer, 1 GiB a sample at T = 32768)."""
        if call.mask is None:
            return call
        held = {id(other.mask): other.mask for other in self.formed.values() if other.mask is not None}
        for mask in held.values():  # each distinct mask once
            if mask.shape == call.mask.shape and mask.device == call.mask.device and bool(torch.equal(mask, call.mask)):
                return dataclasses.replace(call, mask=mask)
        return dataclasses.replace(call, mask=call.mask.clone())

    def _digest(self, index: int, call: KeptCall) -> torch.Tensor:
        """(1, 32) uint8: the SHA-256 of call ``index``'s scale and mask and of the bias it kept, where it adds one:
        what torchrun's processes compare once their banks are joined (rows formed again take process 0's); hashed
        once while the kept bias is the same."""
        bias = self.biases.get(index)
        if bias is None:
            return call.digest
        held = self.digests.get(index)
        if held is None or held[0] is not bias.values:
            raw = bytes(call.digest[0].tolist()) + bias.values.float().contiguous().cpu().numpy().tobytes()
            held = self.digests[index] = (bias.values, torch.tensor(list(hashlib.sha256(raw).digest()),
                                                                    dtype=torch.uint8)[None])  # fmt: skip
        return held[1]

    def rows_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int, heads: int,
                   want_bias: bool) -> RowBlock:  # fmt: skip
        """Rows r0 .. r1 - 1 of call ``layer`` for one sample of ``bank`` (the one kept in, or under torchrun every
        process's joined), formed as a traced call forms them (float32), against keys 0 .. r1 - 1, or every key where
        the call sees keys after its query."""
        kept = self.formed[layer]
        keys = r1 if self.causal(layer) else bank.seq_len(layer, "k")
        q = bank.get(layer, "q", sample, r0, r1).view(1, r1 - r0, heads, -1).transpose(1, 2)
        k = bank.get(layer, "k", sample, 0, keys).view(1, keys, heads, -1).transpose(1, 2)
        own = None
        if layer in self.by_sample:  # this sample's own cells, (1, 1 or H, rows, keys)
            own = bank.get_cells(layer, SAMPLE_CELLS, sample, r0, r1, keys).to(q.device)[None]
        cells = own if own is not None else kept.rows(r0, r1, q.device, keys)
        bias = None
        if layer in self.biases:  # (1, H, rows, keys): the one every sample added (or this one's), 0 where not attended
            added = self._bias_of(layer, bank, sample).rows(r0, r1, keys).to(q.device)
            bias = torch.where(cells, added, 0.0).expand(1, heads, -1, -1)
        sinks = None
        if self.sinks.get(layer):  # (1, H, rows): each row's sink logit, beside the keys in the softmax
            sinks = bank.get(layer, SAMPLE_SINKS, sample, r0, r1).T[None].to(q.device)
        scores, weights = formed_rows(q, k, kept.scale, cells, bias, kept.softcap, sinks)
        if want_bias and bias is None:  # a call that added nothing beside calls that add a bias (an encoder-decoder's
            bias = torch.zeros(1, heads, r1 - r0, keys, device=q.device)  # cross attention): 0, as its stream sends
        return RowBlock(layer, sample, r0, weights, scores=scores, bias=bias if want_bias else None, attended=own)

    def _bias_of(self, layer: int, bank: Any, sample: int) -> KeptBias:
        """The bias ``sample`` added to call ``layer``: the one every sample added, or where it differs by sample, the
        sample's own from ``bank``."""
        first = self.biases[layer]
        if layer not in self.bias_by_sample:
            return first
        values = bank.get(layer, SAMPLE_BIAS, sample, 0, first.values.shape[-1])  # (L, H)
        return KeptBias(first.form, values.T[None], first.q_len)

    def attended(self, layer: int) -> torch.Tensor | None:
        """The one mask call ``layer`` attended where not its rule; None where its rule or each sample's own cells."""
        return None if layer in self.by_sample else self.formed[layer].mask


def _scale_differs(index: int, ops: SdpaOperands, first: KeptCall, sample: int) -> MasksDifferBySample:
    """Rows formed again take one scale (and softcap) for every sample: a call whose scale or cap changes is streamed
    instead."""
    if ops.scale != first.scale:
        what = f"scaled q·k by {ops.scale!r} for sample {sample} or one of its batch, by {first.scale!r} for the first"
    else:
        what = (f"capped its scores at {ops.softcap!r} for sample {sample} or one of its batch, at {first.softcap!r} "
                "for the first")  # fmt: skip
    return MasksDifferBySample(f"attention call {index} {what}")


class FormsKeptCallsAgain(FormsRowsAgain):
    """Mixed into an adapter whose keeping forward hands each call to a :class:`KeptCalls` (traced models, transformers'
    hooked ones): its rows, scale, key heads and mask are that one's, the last :meth:`keep`'s."""

    _kept: KeptCalls | None = None
    n_heads: int

    @property
    def fused_rows(self) -> bool:  # type: ignore[override]
        """A call formed again is c·q·kᵀ (+ the bias kept) under its mask, its softmax over cap·tanh(s / cap) where
        it softcaps and beside its sink columns where it has them: what the fused kernels form."""
        return bool(self.replays)

    def score_softcap(self, layer: int) -> float | None:
        assert self._kept is not None
        return self._kept.formed[layer].softcap

    def sink_logits(self, layer: int, bank: Any) -> torch.Tensor | None:
        """The bank's (N, T, H) sink logits of ``layer``, read in whole where they spilled to a file (H floats a
        position, where q alone is H·d)."""
        if self._kept is None or not self._kept.sinks.get(layer):
            return None
        return bank.every(layer, SAMPLE_SINKS)

    def rows_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int, want_bias: bool) -> RowBlock:
        assert self._kept is not None
        return self._kept.rows_again(layer, bank, sample, r0, r1, self.n_heads, want_bias)

    def score_scale(self, layer: int) -> float:
        assert self._kept is not None
        return self._kept.formed[layer].scale

    def _one_bias(self, layer: int) -> KeptBias | None:
        """The kept bias of causal ``layer`` over the causal triangle, the call's one rule (no mask of its own, no
        softcap, one set of cells and one bias for every sample), in whatever form it was kept."""
        kept = self._kept
        if kept is None or layer in kept.by_sample or layer in kept.bias_by_sample or not self.layer_causal(layer):
            return None
        call, bias = kept.formed[layer], kept.biases.get(layer)
        if call.mask is not None or call.softcap is not None or bias is None:
            return None
        return bias

    def sample_keys(self, layer: int, bank: Any) -> torch.Tensor | None:
        """Each sample's own row of keys of causal ``layer`` as the bank holds it (L, H) a sample, where its bias is of
        the key alone and differs by sample (:meth:`FormsRowsAgain.sample_keys`), with no softcap: (N, H, T)."""
        kept = self._kept
        if kept is None or layer not in kept.bias_by_sample or not self.layer_causal(layer):
            return None
        if kept.biases[layer].form != "key" or kept.formed[layer].softcap is not None:
            return None
        whole = bank.every(layer, SAMPLE_BIAS)  # (N, L, H)
        return whole.transpose(1, 2).float().expand(-1, self.n_heads, -1)

    def kept_bias(self, layer: int) -> tuple[str, torch.Tensor] | None:
        """The kept bias of a causal call with no mask of its own, as :meth:`FormsRowsAgain.kept_bias` gives it, where
        every causal cell showed its value (one read a layer): a table of j - i turned into f(d), d = i - j (index
        T - 1 - d held j - i = -d), a row of keys as held, cells as held."""
        bias = self._one_bias(layer)
        if bias is None:
            return None
        values = bias.values[0]  # (1 or H, L)
        if bias.form == "offset":
            form, values = "distance", values[:, : bias.q_len].flip(-1)
        elif bias.form == "key":
            form = "key"
        else:  # (1 or H, T, T)
            form = "cells"
        shown = values.tril() if form == "cells" else values  # (NaN above the diagonal: never shown, never read)
        if bool(shown.isnan().any()):
            return None
        return form, values if form == "cells" else values.expand(self.n_heads, -1)

    def bias_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int) -> torch.Tensor | None:
        """The kept bias's rows r0 .. r1 - 1 against keys 0 .. r1 - 1, (1, H, rows, r1): every sample's, which the
        keeping forward compared with it exactly."""
        bias = self._one_bias(layer)
        return None if bias is None else bias.rows(r0, r1, r1).expand(1, self.n_heads, -1, -1)

    def key_repeats(self, layer: int) -> int:
        return 1 if self._kept is None else self._kept.groups.get(layer, 1)

    def attended(self, layer: int) -> torch.Tensor | None:
        assert self._kept is not None
        return self._kept.attended(layer)
