"""The bias a traced or hooked call added, kept in the smallest form that gives every attended cell back: a row of
keys (BLOOM, MPT, Falcon: m_h·j), a table of j - i (ALiBi, T5's buckets, KERPLE), or cell by cell. What
:class:`~biasviz.adapters.kept_calls.KeptCalls` keeps once for every sample, or, where it differs by sample, per sample
in its bank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from biasviz.tracing.calls import CompactBias, SdpaOperands, offsets


@dataclass
class KeptBias(CompactBias):
    """The one bias every sample added to a call, over the cells each attends, held as small as its form allows.

    ``form``: "key" where it depends on the key alone, (1, 1 or H, Tk) (BLOOM, MPT, Falcon: m_h·j); "offset" where on
    j - i alone, (1, 1 or H, Tq + Tk - 1) indexed by j - i + Tq - 1 (ALiBi as -m_h·(i - j), T5's buckets, KERPLE);
    "cells" otherwise, (1, 1 or H, Tq, Tk). Found by writing the cells again from the smaller form and comparing,
    exactly: the rows formed again add the very values the call added, and nothing of the bias grows with T² unless it
    must. ``values`` is NaN where no sample's attended cell has shown a value yet (a padded sample shows fewer; a later
    one fills in the rest, :meth:`take`).
    """

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
    def shown_by(cls, form: str, bias: torch.Tensor, kept: torch.Tensor) -> KeptBias:
        """Each sample's own values of ``form`` over the cells it attends: ``bias`` and ``kept`` (B, 1 or H, Tq, Tk) ->
        values (B, 1 or H, L), NaN where a sample attends no cell of an entry; :meth:`fits` (one comparison for the
        batch) then says whether each sample's bias is of the form."""
        return cls._shown(form, torch.where(kept, bias, float("-inf")), by_sample=True)

    @classmethod
    def _shown(cls, form: str, shown: torch.Tensor, by_sample: bool = False) -> KeptBias:
        """The values of ``form`` that ``shown`` (S, 1 or H, Tq, Tk), -inf where not attended, shows (the largest
        where samples or cells disagree, which :meth:`fits` then refuses); ``by_sample``: each sample's own."""
        q_len, k_len = shown.shape[-2:]
        if not by_sample:
            shown = shown.amax(0, keepdim=True)  # (1, 1 or H, Tq, Tk)
        if form == "key":
            by = shown.amax(-2)
        elif form == "offset":
            index = offsets(0, q_len, k_len, q_len, shown.device).flatten().expand(*shown.shape[:2], -1)
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

    def merge(self, other: CompactBias) -> bool:
        """Whether ``other`` (a later batch's, of this form) holds this one's values wherever both show one; its values
        only it shows are taken in. False: it does not (nothing taken)."""
        if other.form != self.form or other.values.shape[-1] != self.values.shape[-1]:
            return False
        mine, theirs = torch.broadcast_tensors(self.values, other.values)  # (one for every head, or one a head)
        both = ~mine.isnan() & ~theirs.isnan()
        if not bool((torch.where(both, mine, 0.0) == torch.where(both, theirs, 0.0)).all()):
            return False
        self.values = torch.where(mine.isnan(), theirs, mine)
        return True


def added_bias(ops: SdpaOperands) -> torch.Tensor:
    """(1 or B, 1 or H, T, T) float32: the bias a call adds (its float mask's values) over the cells it attends, 0 on
    the others and where it adds none."""
    added = torch.zeros((), device=ops.kept.device) if ops.additive is None else ops.additive.float()
    return torch.where(ops.kept, added, 0.0)
