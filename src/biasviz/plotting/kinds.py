"""The table of ``plot --kind``: each kind's name, what it draws, which files it needs and the function that makes its
figures, read by the CLI's choice, its help and its dispatch (and by anything that lists the kinds), so that a new
figure is its draw function plus a row here. No matplotlib here: ``biasviz --help`` reads it, so each row names its
functions as ``"module:function"``, imported only when the kind is drawn."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What every row's ``run`` is: ``run(job, kind, out_dir, formats, dpi)`` -> the files written (none where the figures
#: are kept, as ``biasviz.plot`` keeps them), ``job`` being a :class:`biasviz.plotting.job.PlotJob`.
Runner = Callable[[Any, str, Path, list[str], int], list[Path]]
RUNNER_PARAMETERS = ("job", "kind", "out_dir", "formats", "dpi")

_CMD = "biasviz.plotting.job"
_POSITION = "biasviz.plotting.position_kinds"
_MEASURES = "biasviz.plotting.measures_plots"


@dataclass(frozen=True)
class PlotKind:
    name: str
    draws: str  # what the figure shows, for --help
    needs: str  # "any" file, a "summary", or a "sweep"
    run: str  # "module:function" that makes the kind's figures (a Runner)
    figure: str = ""  # for a runner that draws several kinds: "module:function" drawing this kind's figure
    about: str = ""  # for such a runner: what the figure shows, for the saved file's metadata


PLOT_KINDS: tuple[PlotKind, ...] = (
    PlotKind("bias", "the additive bias b(i, j) of each head", "any", f"{_CMD}:run_matrices"),
    PlotKind("weights", "the post-softmax attention weights of each head", "any", f"{_CMD}:run_matrices"),
    PlotKind("all", "both bias and weights", "any", f"{_CMD}:run_matrices"),
    PlotKind("dynamics", "per head, the distance profile b(d) at each checkpoint, coloured by step", "sweep",
             f"{_CMD}:run_dynamics"),
    PlotKind("profile", "per head, the mean over samples and cells with i - j = d against d, with a +-1 std band "
             "(bias and weights; on a summary P(d) beside b(d))", "any", f"{_CMD}:run_over_samples"),
    PlotKind("std", "the per-cell standard deviation over samples (bias and weights)", "any",
             f"{_CMD}:run_over_samples"),
    PlotKind("positional", "each head's positional logits P(i, j), relative to its value at distance 0 (two samples "
             "or more)", "summary", f"{_POSITION}:run_positional",
             about="positional logits P(i, j) minus each head's P at distance 0"),
    PlotKind("sinks", "each head's mean weight on the first keys (docs/positional.md)", "summary",
             f"{_POSITION}:run_sinks", about="mean attention weight on each of the first keys (sink share at key 0)"),
    PlotKind("bands", "the weight a query puts at each distance, with 95% bands over samples "
             "(docs/position-measures.md)", "summary", f"{_POSITION}:run_measure", f"{_MEASURES}:bands_figure",
             "weight a query puts on each distance bin, with a 95 % band over samples"),
    PlotKind("context", "the weight on each tenth of the keys a query sees, with 95% bands (docs/position-measures.md)",
             "summary", f"{_POSITION}:run_measure", f"{_MEASURES}:context_figure",
             "weight on each tenth of the keys a query sees, with a 95 % band over samples"),
    PlotKind("frequency", "per head, the mean norm of each rotary pair of q and k against the pair (0: fastest), "
             "with 95% bands (rotary models; docs/position-measures.md)", "summary", f"{_POSITION}:run_measure",
             f"{_MEASURES}:frequency_figure",
             "mean norm of each rotary pair of q and of k, with a 95 % band over samples"),
)  # fmt: skip
NAMES = tuple(k.name for k in PLOT_KINDS)


def kind_names() -> tuple[str, ...]:
    """The kinds, read from the table when asked (a row added at run time counts)."""
    return tuple(k.name for k in PLOT_KINDS)


def plot_kind(name: str) -> PlotKind:
    """The table's row of ``name`` (a KeyError where there is none)."""
    for row in PLOT_KINDS:
        if row.name == name:
            return row
    raise KeyError(name)


def resolve(target: str) -> Any:
    """``"module:function"`` -> the function, importing its module."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def runner(name: str) -> Runner:
    """The function that makes the figures of kind ``name``."""
    return resolve(plot_kind(name).run)


def kind_help() -> str:
    """``--kind``'s help: one clause per kind, with the file it needs where that is not any."""
    needs = {"summary": " (a summary)", "sweep": " (a sweep file from 'extract --checkpoints')", "any": ""}
    return "; ".join(f"'{k.name}'{needs[k.needs]}: {k.draws}" for k in PLOT_KINDS) + "."
