"""What an adapter implements beside :class:`~biasviz.adapters.base.ModelAdapter` when it can form a layer's rows again.

Every adapter has one way out of a forward, :meth:`ModelAdapter.stream`. An adapter whose model forms c·q·kᵀ (+ b) in
a way it can repeat (biasviz's own models; traced SDPA and eager calls, and transformers' hooked models, through
:class:`~biasviz.adapters.kept_calls.KeptCalls`) can also keep, per sample, only what
forms the rows (q, k, the layer's input) and form them again afterwards, block of rows by block of rows over every
sample (:mod:`biasviz.extraction.replayed`). That is how a summary's time stays linear in the number of samples
without an (H, T, T) tensor of moments. The methods below are that way and nothing else reads them; an adapter says it
has them by being a :class:`FormsRowsAgain` whose :attr:`~FormsRowsAgain.replays` is true (:func:`forms_rows_again`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch

from biasviz.adapters.rows import RowBlock

SAMPLE_CELLS = "attended"  # a bank's name for each sample's own attended cells, where samples are masked differently
SAMPLE_BIAS = "bias"  # each sample's own bias of a kept call, where it differs by sample (keys, or j - i)
SAMPLE_SINKS = "sinks"  # each row's sink logit of a kept call whose softmax runs over sink columns too (GPT-OSS)
MASK_DIGEST = "mask digest"  # under torchrun: each sample's call's mask as a SHA-256 digest, compared once joined


class FormsRowsAgain:
    """Mixed into an adapter class whose rows can be formed again from what a forward kept in a bank (a
    :class:`~biasviz.summaries.bank.SampleBank`)."""

    replays: ClassVar[bool] = True  # an instance may say False (a call that does more than c·q·kᵀ + b, softcapped)
    # True: a layer's rows are c·q·kᵀ + b from the bank's q and k, (N, T, H·d) each, and :meth:`bias_again`'s bias:
    # what the fused statistics kernels form (biasviz.summaries.fused_layer)
    fused_rows: ClassVar[bool] = False

    @contextlib.contextmanager
    def keep(self, layers: list[int], bank: Any, tick: Callable[[int], None] | None = None) -> Iterator[None]:
        """Within the block, each :meth:`~ModelAdapter.forward` puts into ``bank`` what :meth:`rows_again` needs of
        ``layers``, per sample and position; ``tick(batch)`` as each attention layer is reached. The forward itself
        runs at full speed (nothing listens at the weights)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def rows_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int, want_bias: bool) -> RowBlock:
        """One sample's :class:`RowBlock` of rows r0 .. r1 - 1 of ``layer`` (bias only when ``want_bias``), from what
        :meth:`keep` put in ``bank``: the values the forward formed, against keys 0 .. r1 - 1 where the call is causal,
        every key where it sees keys after its query (:meth:`~ModelAdapter.layer_causal`)."""
        raise NotImplementedError

    def bias_again(self, layer: int, bank: Any, sample: int, r0: int, r1: int) -> torch.Tensor | None:
        """One sample's bias rows r0 .. r1 - 1 of ``layer`` against keys 0 .. r1 - 1, (1, H, rows, r1), formed by the
        model's own scheme from what :meth:`keep` put in ``bank``, nothing else of the rows; None where the adapter
        cannot form them alone (the fused statistics then leave the layer to :meth:`rows_again`)."""
        return None

    def bias_ends(self, layer: int, bank: Any) -> torch.Tensor | None:
        """(N, H, T) float32: each sample's e where the bias of causal ``layer`` is e(i) - e(j) of that sample's own
        input (CABLE's and FoX's cumulative sums: a bias that differs by sample, which the fused kernels form from two
        values a position), formed by the model's own scheme from what :meth:`keep` put in ``bank``; None otherwise."""
        return None

    def sample_keys(self, layer: int, bank: Any) -> torch.Tensor | None:
        """(N, H, T) float32: each sample's own row of keys g_a(j), where the bias of causal ``layer`` is a function of
        the key alone that differs by sample (BLOOM's m·j beside padding, its positions after each sample's own), as
        :meth:`keep` banked it (NaN on keys a sample attends with no query); None otherwise."""
        return None

    def kept_bias(self, layer: int) -> tuple[str, torch.Tensor] | None:
        """The bias every sample added to causal ``layer``, on every cell of the causal triangle, where the forward
        under :meth:`keep` kept one in a form the fused kernels add: ``("distance", f)``, f (H, T) of d = i - j alone
        (ALiBi, T5's buckets written into a call: what the kernels add as a scheme's table); ``("key", g)``, g (H, T)
        of the key j alone (BLOOM's m·j); ``("cells", b)``, (1 or H, T, T) cell by cell where it is neither (NaN above
        the diagonal). None otherwise."""
        return None

    def score_scale(self, layer: int) -> float:
        """c in s = c·q·k + b: what the attention of ``layer`` multiplies q·k by."""
        raise NotImplementedError

    def score_softcap(self, layer: int) -> float | None:
        """cap where the softmax of ``layer`` takes cap·tanh(s / cap) (Gemma 2's logit softcapping); None: s itself."""
        return None

    def sink_logits(self, layer: int, bank: Any) -> torch.Tensor | None:
        """(N, T, H) float32: each sample's and row's sink logit, where the softmax of ``layer`` runs over sink columns
        beside the keys (GPT-OSS), as :meth:`keep` put them in ``bank``; None: over the keys alone."""
        return None

    def key_repeats(self, layer: int) -> int:
        """How many query heads share each key head of ``layer`` where the bank holds k repeated for them (grouped
        queries); 1 where it holds each key head once (the fused kernels then read one copy, GROUP of them)."""
        return 1

    def attended(self, layer: int) -> torch.Tensor | None:
        """The cells ``layer`` attends to, (1, 1 or H, T, T) bool, as the forward under :meth:`keep` masked them, where
        that is not the causal triangle (a sliding window, a block mask); None: exactly causal."""
        return None


def forms_rows_again(adapter: Any) -> bool:
    """Whether ``adapter`` can form its rows again (:class:`FormsRowsAgain`, and it says so for this model)."""
    return isinstance(adapter, FormsRowsAgain) and bool(adapter.replays)
