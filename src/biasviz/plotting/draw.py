"""The figures of ``biasviz plot`` as a library call: :func:`figures` checks the options as the command does (in its
words: the messages name the command's options) and returns the figures instead of writing them. The command parses
its options, calls the same pieces (:func:`plot_scheme`, :mod:`biasviz.plotting.plot_checks`, the kind's runner) and
saves what the job hands it; ``biasviz.plot`` calls :func:`figures`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasviz.common.errors import BiasvizError, UsageError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.plotting.job import Sink

#: The values ``--normalize`` and ``--reduce`` take, and the ranges of ``--dpi`` and ``--max-cells``
NORMALIZE = ("none", "diagonal")
REDUCE = ("mean", "max")
DPI_RANGE = (50, 1200)
MAX_CELLS_RANGE = (16, 10_000)


def _choices(option: str) -> tuple[str, ...] | None:
    """The values ``--OPTION`` takes, where it takes one of a set (read when asked: the kinds table may grow)."""
    from biasviz.plotting.kinds import kind_names
    from biasviz.plotting.style import VENUE_WIDTHS

    return {"kind": kind_names(), "normalize": NORMALIZE, "reduce": REDUCE, "style": tuple(VENUE_WIDTHS)}.get(option)


def check_option(option: str, value: Any) -> None:
    """A UsageError, worded as the command's own, where ``value`` is not one ``--OPTION`` takes (a value of a set,
    or a whole number in a range); options of neither sort are taken as they are."""
    choices = _choices(option)
    if choices is not None and value not in choices:
        raise UsageError(f"Invalid value for '--{option}': {value!r} is not one of {', '.join(map(repr, choices))}.")
    bounds = {"dpi": DPI_RANGE, "max-cells": MAX_CELLS_RANGE}.get(option)
    if bounds is not None and value is not None and not bounds[0] <= value <= bounds[1]:
        raise UsageError(f"Invalid value for '--{option}': {value} is not in the range {bounds[0]}<=x<={bounds[1]}.")


def plot_scheme(scheme: str | None, path: Path | None) -> tuple[str, Path]:
    """(scheme name, input file) as ``--scheme`` and ``--input`` give them: the scheme ``path`` records where none is
    given, the file ``data/<scheme>.h5`` where no path is; a name the registry does not know is taken where the file
    holds it (a traced model's) and it can name a file."""
    from biasviz.common.outputs import file_stem
    from biasviz.plotting.plot_checks import recorded_scheme
    from biasviz.schemes import canonical_name

    if scheme is None:
        if path is None:
            raise UsageError("give --scheme, --input or both (--input alone: the scheme it records)")
        scheme = recorded_scheme(path)
    try:
        name = canonical_name(scheme)
    except BiasvizError:
        name = scheme.strip()
        if not (path or Path("data") / f"{name}.h5").is_file() or file_stem(name) != name:
            raise
    return name, path or Path("data") / f"{name}.h5"


def keeping(kept: list[tuple[Figure, str | None]]) -> Sink:
    """A job's sink that keeps each figure with the style it is saved in, its LaTeX caption as
    ``fig.biasviz_caption``, and writes nothing."""
    from biasviz.plotting.style import DEFAULT_STYLE

    def keep(fig: Figure, stem: Path, formats: list[str], caption: str | None, options: dict[str, Any]) -> list[Path]:
        fig.biasviz_caption = caption  # type: ignore[attr-defined]
        kept.append((fig, options.get("style", DEFAULT_STYLE)))
        return []

    return keep


def figures(path: str | Path, kind: str = "bias", *, scheme: str | None = None, layer: int = -1,
            sample: int | str | None = None, step: int | None = None, normalize: str = "none",
            shared_scale: bool | None = None, cmap: str | None = None, log: bool = False, log_distance: bool = False,
            style: str | None = None, width: str | None = None, dpi: int = 200, reduce: str = "mean",
            max_cells: int | None = None) -> list[tuple[Figure, str | None]]:  # fmt: skip
    """The figures ``biasviz plot --input PATH --kind KIND`` saves, each with the paper style it is saved in.

    Keywords are the command's options, checked as it checks them: ``sample`` None is its default (sample 0, not
    given), ``style`` None the default style, ``dpi`` the PNG resolution (it also sets how finely large matrices
    are drawn). ``scheme`` None: the scheme the file records.
    """
    from biasviz.plotting.job import PlotJob
    from biasviz.plotting.kinds import runner
    from biasviz.plotting.plot_checks import fit_to_kind, parse_sample
    from biasviz.plotting.style import DEFAULT_STYLE, with_width

    style = DEFAULT_STYLE if style is None else style
    for option, value in (("kind", kind), ("normalize", normalize), ("style", style), ("dpi", dpi),
                          ("reduce", reduce), ("max-cells", max_cells)):  # fmt: skip
        check_option(option, value)
    name, file = plot_scheme(scheme, Path(path))
    style = with_width(style, width)
    value = 0 if sample is None else parse_sample(str(sample))
    normalize, log, log_distance, sample_given = fit_to_kind(kind, normalize, log, log_distance, value,
                                                             sample is not None)  # fmt: skip
    kept: list[tuple[Figure, str | None]] = []
    job = PlotJob(scheme=name, path=file, layer=layer, sample=value, normalize=normalize, shared_scale=shared_scale,
                  cmap=cmap, log_scale=log, log_distance=log_distance, style=style, reduce_how=reduce,
                  max_cells=max_cells, sink=keeping(kept), step=step, sample_given=sample_given)  # fmt: skip
    runner(kind)(job, kind, Path("figures"), ["pdf", "png"], dpi)  # the command's default folder and formats
    return kept


__all__ = ["DPI_RANGE", "MAX_CELLS_RANGE", "NORMALIZE", "REDUCE", "check_option", "figures", "keeping", "plot_scheme"]
