"""The table of ``plot --kind``: each kind's name, what it draws and which files it needs, read by the CLI's choice
and help (and by anything that lists the kinds), so that a new figure is its draw function plus a row here. No
matplotlib here: ``biasviz --help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlotKind:
    name: str
    draws: str  # what the figure shows, for --help
    needs: str  # "any" file, a "summary", or a "sweep"


PLOT_KINDS: tuple[PlotKind, ...] = (
    PlotKind("bias", "the additive bias b(i, j) of each head", "any"),
    PlotKind("weights", "the post-softmax attention weights of each head", "any"),
    PlotKind("all", "both bias and weights", "any"),
    PlotKind("dynamics", "per head, the distance profile b(d) at each checkpoint, coloured by step", "sweep"),
    PlotKind("profile", "per head, the mean over samples and cells with i - j = d against d, with a +-1 std band "
             "(bias and weights; on a summary P(d) beside b(d))", "any"),
    PlotKind("std", "the per-cell standard deviation over samples (bias and weights)", "any"),
    PlotKind("positional", "each head's positional logits P(i, j), relative to its value at distance 0 (two samples "
             "or more)", "summary"),
    PlotKind("sinks", "each head's mean weight on the first keys (docs/positional.md)", "summary"),
    PlotKind("bands", "the weight a query puts at each distance, with 95% bands over samples "
             "(docs/position-measures.md)", "summary"),
    PlotKind("context", "the weight on each tenth of the keys a query sees, with 95% bands (docs/position-measures.md)",
             "summary"),
    PlotKind("frequency", "per head, the mean norm of each rotary pair of q and k against the pair (0: fastest), "
             "with 95% bands (rotary models; docs/position-measures.md)", "summary"),
)  # fmt: skip
NAMES = tuple(k.name for k in PLOT_KINDS)
SUMMARY_KINDS = tuple(k.name for k in PLOT_KINDS if k.needs == "summary")  # drawn from a summary's own datasets


def kind_help() -> str:
    """``--kind``'s help: one clause per kind, with the file it needs where that is not any."""
    needs = {"summary": " (a summary)", "sweep": " (a sweep file from 'extract --checkpoints')", "any": ""}
    return "; ".join(f"'{k.name}'{needs[k.needs]}: {k.draws}" for k in PLOT_KINDS) + "."
