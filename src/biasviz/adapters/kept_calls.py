"""What a keeping forward kept of each attention call it was given (q, k, the cells attended, the scale, one bias), and
every sample's rows formed again from it (:class:`KeptCalls`): the one way a traced call, or a hooked module's call,
is formed again.

While every sample has one mask, a call keeps it once (:class:`KeptCall`, with the scale its rows are formed with); from
the first sample masked otherwise (padding, packed documents) on, each sample's own cells go into the bank beside its q
and k (:func:`own_cells`), one set for all heads or, where its heads attend cells of their own, one a head.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from biasviz.adapters.again import MASK_DIGEST, SAMPLE_CELLS, FormsRowsAgain
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
class KeptBias:
    """The one bias every sample added to a call, over the cells each attends, held as small as its form allows.

    ``form``: "key" where it depends on the key alone, (1, 1 or H, Tk) (BLOOM, MPT, Falcon: m_h·j); "offset" where on
    j - i alone, (1, 1 or H, Tq + Tk - 1) indexed by j - i + Tq - 1 (ALiBi as -m_h·(i - j), T5's buckets, KERPLE);
    "cells" otherwise, (1, 1 or H, Tq, Tk). Found by writing the cells again from the smaller form and comparing,
    exactly: the rows formed again add the very values the call added, and nothing of the bias grows with T² unless it
    must. ``values`` is NaN where no sample's attended cell has shown a value yet (a padded sample shows fewer; a later
    one fills in the rest, :meth:`take`).
    """

    form: str
    values: torch.Tensor
    q_len: int

    @classmethod
    def of(cls, bias: torch.Tensor, kept: torch.Tensor) -> KeptBias:
        """From one sample's bias ``bias`` (1, 1 or H, Tq, Tk), 0 where ``kept`` (1, 1 or H, Tq, Tk) is False: the
        smallest form that gives its attended cells back (cell by cell where none does)."""
        shown = torch.where(kept, bias, float("-inf"))  # every attended cell says its value; the others nothing
        for form in ("key", "offset"):
            for read in (cls._ends, cls._shown):  # the first and last rows alone say it (no padding), else every cell
                held = read(form, shown)
                if held._near_diagonal(shown) and held.fits(bias, kept):  # a cheap look first, then every cell
                    return held
                if bool(held.seen.all()):  # every value was shown, and the form is not this one
                    break
        return cls._shown("cells", shown)

    @classmethod
    def _ends(cls, form: str, shown: torch.Tensor) -> KeptBias:
        """The values of ``form`` that the first and last query rows of ``shown`` (1, 1 or H, Tq, Tk) show, in O(T):
        every key, and every j - i, where those rows attend every key (a causal call's last row, a bidirectional
        one's)."""
        q_len, k_len = shown.shape[-2:]
        first, last = shown[..., 0, :], shown[..., -1, :]  # (1, 1 or H, Tk)
        if form == "key":
            by = torch.maximum(first, last)
        else:  # the last row holds j - i = j - (Tq - 1), the first j
            by = torch.full((*shown.shape[:2], q_len + k_len - 1), float("-inf"), device=shown.device)
            by[..., :k_len] = last
            by[..., q_len - 1 :] = torch.maximum(by[..., q_len - 1 :], first)
        return cls(form, by.masked_fill(by.isinf(), float("nan")), q_len)

    @classmethod
    def _shown(cls, form: str, shown: torch.Tensor) -> KeptBias:
        """The values of ``form`` that ``shown`` (S, 1 or H, Tq, Tk), -inf where not attended, shows (the largest
        where samples or cells disagree, which :meth:`fits` then refuses)."""
        q_len, k_len = shown.shape[-2:]
        shown = shown.amax(0, keepdim=True)  # (1, 1 or H, Tq, Tk)
        if form == "key":
            by = shown.amax(-2)
        elif form == "offset":
            index = _offsets(0, q_len, k_len, q_len, shown.device).flatten().expand(*shown.shape[:2], -1)
            by = torch.full((*shown.shape[:2], q_len + k_len - 1), float("-inf"), device=shown.device)
            by = by.scatter_reduce(-1, index, shown.flatten(-2), "amax")
        else:
            by = shown
        return cls(form, by.masked_fill(by.isinf(), float("nan")), q_len)  # an attended cell's bias is a number

    @property
    def seen(self) -> torch.Tensor:
        """Where some sample's attended cells have shown a value."""
        return ~self.values.isnan()

    def _near_diagonal(self, shown: torch.Tensor) -> bool:
        """Whether the attended cells of the four diagonals j - i = -2 .. 1 hold this form's values: O(T), and enough
        to tell ALiBi's -m·(i - j) from BLOOM's m·j before every cell is compared."""
        for d in (-2, -1, 0, 1):
            cells = shown.diagonal(d, -2, -1)  # (S, 1 or H, n): cells (i, i + d), i from max(0, -d)
            n = cells.shape[-1]
            i = torch.arange(max(0, -d), max(0, -d) + n, device=shown.device)
            if self.form == "key":
                want = self.values[..., i + d]
            else:
                want = self.values[..., d + self.q_len - 1, None].expand(*self.values.shape[:2], n)
            if not bool(((cells == want) | cells.isinf()).all()):
                return False
        return True

    def fits(self, bias: torch.Tensor, kept: torch.Tensor) -> bool:
        """Whether ``bias`` (B, 1 or H, Tq, Tk), 0 where ``kept`` is False, is this one on every attended cell (a cell
        whose value no sample showed yet is not: NaN)."""
        return bool((torch.where(kept, self.rows(0, self.q_len, bias.shape[-1]), 0.0) == bias).all())

    def take(self, bias: torch.Tensor, kept: torch.Tensor) -> bool:
        """Whether a later batch's ``bias`` is this one, of its form, wherever both show a value; the values only it
        shows are taken in. False: it is not (nothing taken)."""
        if self.fits(bias, kept):  # every value it shows was shown before, and is the same
            return True
        new = self._shown(self.form, torch.where(kept, bias, float("-inf")))
        both = self.seen & new.seen
        if not bool((torch.where(both, self.values, 0.0) == torch.where(both, new.values, 0.0)).all()):
            return False
        merged = KeptBias(self.form, torch.where(self.seen, self.values, new.values), self.q_len)
        if not merged.fits(bias, kept):
            return False
        self.values = merged.values
        return True

    def rows(self, r0: int, r1: int, keys: int) -> torch.Tensor:
        """(1, 1 or H, rows, keys): the bias of query rows r0 .. r1 - 1 against keys 0 .. ``keys`` - 1, where attended
        (the other cells hold a value of the form, or NaN, which no statistic reads)."""
        if self.form == "key":
            return self.values[..., None, :keys].expand(*self.values.shape[:2], r1 - r0, keys)
        if self.form == "offset":  # row i is values[T - 1 - i + j], j < keys: windows of the table, last row first
            start = self.q_len - r1
            return self.values[..., start : self.q_len - r0 - 1 + keys].unfold(-1, keys, 1).flip(-2)
        return self.values[..., r0:r1, :keys]


def _offsets(r0: int, r1: int, keys: int, q_len: int, device: torch.device) -> torch.Tensor:
    """(rows, keys) int64: j - i + Tq - 1 for query rows r0 .. r1 - 1 and keys 0 .. ``keys`` - 1."""
    return torch.arange(keys, device=device)[None, :] - torch.arange(r0, r1, device=device)[:, None] + (q_len - 1)


def added_bias(ops: SdpaOperands) -> torch.Tensor:
    """(1 or B, 1 or H, T, T) float32: the bias a call adds (its float mask's values) over the cells it attends, 0 on
    the others and where it adds none."""
    added = torch.zeros((), device=ops.kept.device) if ops.additive is None else ops.additive.float()
    return torch.where(ops.kept, added, 0.0)


@dataclass
class KeptCalls:
    """One keeping forward's calls: what each kept in ``bank`` and forms every sample's rows again with.

    ``causal(index)`` is a call's rule as the first sample showed it, ``adds_bias(index)`` whether the first sample's
    call added a bias, ``past_query(index, where)`` what to raise when a causal call attends keys after a query (the
    owner marks it as one that sees every key); ``tick(batch)`` as each call is reached.
    """

    bank: Any
    layers: list[int]
    causal: Callable[[int], bool]
    adds_bias: Callable[[int], bool]
    past_query: Callable[[int, str], Exception]
    tick: Callable[[int], None] | None = None
    batch: int = 1
    formed: dict[int, KeptCall] = field(default_factory=dict)  # per call: what forms its rows again
    by_sample: set[int] = field(default_factory=set)  # calls whose samples are masked differently: cells banked
    groups: dict[int, int] = field(default_factory=dict)  # per call: query heads per key head (k banked repeated)
    biases: dict[int, KeptBias] = field(default_factory=dict)  # per call that adds a bias: the first sample's
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
            raise self.past_query(index, f"for sample {bank.start} or one of its batch")
        if self.adds_bias(index):  # the first sample's call added one
            self._keep_bias(index, ops)
        elif ops.additive is not None:
            raise BiasvizError(f"attention call {index} added a bias for sample {bank.start} though it added none on "
                               "the first: the model's bias depends on the input; summarise it with --resolution "
                               "equal to --seq-len and --batch-size covering every sample")  # fmt: skip
        self._keep_cells(index, ops)
        heads = ops.q.shape[1]
        self.groups[index] = heads // ops.k.shape[1]
        bank.put(index, "q", ops.q.transpose(1, 2).flatten(2))  # (B, T, H·E)
        bank.put(index, "k", repeat_kv(ops.k, heads).transpose(1, 2).flatten(2))

    def _keep_bias(self, index: int, ops: SdpaOperands) -> None:
        """The bias call ``index`` adds, over the cells each sample attends (0 elsewhere, padding beside a bias
        included): kept once, from the first batch, and every later sample's compared with it on its own cells,
        exactly; one that differs starts the summary again, streamed (rows formed again add one bias to every
        sample)."""
        bias = added_bias(ops)
        first = self.biases.get(index)
        if first is None:  # (one copy, not one a batch, in the smallest form the first sample's has)
            first = self.biases[index] = KeptBias.of(bias[:1], ops.kept[:1])
            if bias.shape[0] == ops.kept.shape[0] == 1:  # one bias and mask for the whole batch: just compared
                return
        if not first.take(bias, ops.kept):
            raise MasksDifferBySample(f"attention call {index} added another bias for sample {self.bank.start} or "
                                      "one of its batch than for the first")  # fmt: skip

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
        first = self.formed.setdefault(index, kept or KeptCall(ops.scale, None, self.causal(index), ops.softcap))
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
        if layer in self.biases:  # (1, H, rows, keys): the one every sample added, 0 where not attended
            added = self.biases[layer].rows(r0, r1, keys).to(q.device)
            bias = torch.where(cells, added, 0.0).expand(1, heads, -1, -1)
        scores, weights = formed_rows(q, k, kept.scale, cells, bias, kept.softcap)
        return RowBlock(layer, sample, r0, weights, scores=scores, bias=bias if want_bias else None, attended=own)

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
        """A call formed again is c·q·kᵀ (+ the one bias kept) under its one mask: what the fused kernels form, where it
        adds no bias and takes no softcap."""
        kept = self._kept
        return bool(self.replays) and (kept is None or all(c.softcap is None for c in kept.formed.values()))

    def rows_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int, want_bias: bool) -> RowBlock:
        assert self._kept is not None
        return self._kept.rows_again(layer, bank, sample, r0, r1, self.n_heads, want_bias)

    def score_scale(self, layer: int) -> float:
        assert self._kept is not None
        return self._kept.formed[layer].scale

    def _offset_bias(self, layer: int) -> KeptBias | None:
        """The kept bias of causal ``layer`` where it is a table of j - i over the causal triangle, the call's one rule
        (no mask of its own, no softcap, one set of cells for every sample)."""
        kept = self._kept
        if kept is None or layer in kept.by_sample or not self.layer_causal(layer):
            return None
        call, bias = kept.formed[layer], kept.biases.get(layer)
        if call.mask is not None or call.softcap is not None or bias is None or bias.form != "offset":
            return None
        return bias

    def bias_table(self, layer: int) -> torch.Tensor | None:
        """The kept bias of a causal call with no mask of its own, held as a table of j - i that every causal cell
        showed: f(d) = the table at j - i = -d."""
        bias = self._offset_bias(layer)
        if bias is None:
            return None
        f = bias.values[0, :, : bias.q_len].flip(-1)  # (1 or H, T): index T - 1 - d holds j - i = -d
        return None if bool(f.isnan().any()) else f.expand(self.n_heads, -1)  # (one read a layer)

    def bias_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int) -> torch.Tensor | None:
        """The kept bias's rows r0 .. r1 - 1 against keys 0 .. r1 - 1, (1, H, rows, r1), where it is a table of j - i:
        every sample's, which the keeping forward compared with it exactly."""
        bias = self._offset_bias(layer)
        return None if bias is None else bias.rows(r0, r1, r1).expand(1, self.n_heads, -1, -1)

    def key_repeats(self, layer: int) -> int:
        return 1 if self._kept is None else self._kept.groups.get(layer, 1)

    def attended(self, layer: int) -> torch.Tensor | None:
        assert self._kept is not None
        return self._kept.attended(layer)
