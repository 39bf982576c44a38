"""How a summary runs, chosen once: every fact the choice reads, as plain values, and one function that reads them.

:func:`biasviz.extraction.summary.summarise` gathers the facts of the adapter and the run, asks :func:`plan`, and runs
what it names. Two ways to reach the statistics, and how each quantity's samples meet (:mod:`biasviz.summaries.layer`):

- **formed again**: adapters that can form their rows again (:mod:`biasviz.adapters.again`) keep what forms them per
  sample and form each block of rows over every sample at once, so each quantity's samples meet
  ``joint`` (per-cell moments of one block at a time, time linear in samples, nothing of size T²);
- **streamed**: the rows as the model forms them, a batch of samples at a time (:meth:`ModelAdapter.stream`). Where one
  batch holds every sample they meet ``joint`` too; otherwise per-cell moments (``cells``) are kept across batches.

A bias the scheme declares the same for every input starts ``shared`` (one sample summarised for all), measured
against the first sample as the rows come and summarised per sample from the first difference on; torchrun processes
that join per-cell moments cannot compare with process 0's first sample, so there it is summarised per sample. What
only the run can show (a declaration measured wrong, samples masked differently) changes a quantity's summary while it
runs; this chooses where it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SummaryFacts:
    """What the way a summary runs depends on."""

    forms_rows_again: bool  # the adapter keeps what forms its rows and forms them again (adapters/again.py)
    captures_scores: bool  # streamed: the adapter sends the scores (and q, k) when asked
    adds_bias: bool  # the scheme adds a bias: a ``bias`` quantity
    declared_shared: bool  # the scheme declares its bias the same for every input (measured, never trusted)
    merged: bool  # torchrun: every process's per-cell moments joined on process 0
    gathered: bool  # torchrun: every process's bank joined on process 0, which forms the rows of all samples
    streamed: bool  # the rows are to be streamed even where they could be formed again
    samples: int  # samples in this process
    batch_size: int  # samples per forward, as asked


@dataclass(frozen=True)
class SummaryPlan:
    """Where a summary starts."""

    formed_again: bool  # rows formed again from the bank; else streamed
    modes: dict[str, str] = field(default_factory=dict)  # quantity -> how its samples meet: shared, joint or cells
    streamed_position: bool = False  # streamed scores, q and k feed docs/positional.md's sums as they come
    forward_batch: int = 1  # samples per forward while streamed (all of them where they meet joint)

    def streamed_bytes(self, heads: int, seq_len: int, *, samples: int, positional: bool) -> int:
        """What a streamed summary keeps of each layer for the whole run at least, in bytes (0 where rows are formed
        again): per (head, query, key) cell, float64 moments (mean, m2) of each quantity whose samples meet across
        batches (``cells``), the first sample's rows of a declared bias compared across batches (2 bytes at the
        least), and with ``positional`` (P, two samples or more) float32 sums of the scores and of any bias."""
        if self.formed_again:
            return 0
        several = self.forward_batch < samples
        per_cell = sum(16 if mode == "cells" else 2 if mode == "shared" and several else 0
                       for mode in self.modes.values())  # fmt: skip
        if self.streamed_position and positional:
            per_cell += 4 * (1 + ("bias" in self.modes))
        return per_cell * heads * seq_len * seq_len


def plan(facts: SummaryFacts) -> SummaryPlan:
    """The way a summary of ``facts`` runs (see the module's text)."""
    formed_again = facts.forms_rows_again and not facts.streamed and (not facts.merged or facts.gathered)
    joint = formed_again or (not facts.merged and facts.batch_size >= facts.samples)
    meet = "joint" if joint else "cells"
    modes = {"weights": meet}
    streamed_position = not formed_again and facts.captures_scores
    if formed_again or streamed_position:  # the softmax's input: formed again, or sent by the model
        modes["scores"] = meet
    if facts.adds_bias:
        declared = facts.declared_shared and (formed_again or not facts.merged)
        modes["bias"] = "shared" if declared else meet
    batch = facts.samples if joint and not formed_again else facts.batch_size
    return SummaryPlan(formed_again, modes, streamed_position, batch)
