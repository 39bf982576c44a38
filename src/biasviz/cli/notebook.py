"""``biasviz.open`` and ``biasviz.plot``: the commands' files and figures where researchers work, in Python.

:class:`View` adds to the store's read-only :class:`~biasviz.store.view.FileView` what sits above the store: the
figures of ``biasviz plot`` (the command itself runs, every check included, and hands its figures over instead
of writing them), the page of ``biasviz explore``, and the text of ``biasviz info`` as its ``repr``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.store.view import FileView

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.explorer import ExplorerPage


class View(FileView):
    """A biasviz file opened read-only (see :class:`FileView`), with its figures and explorer page."""

    def __repr__(self) -> str:
        if self._closed:
            return f"<biasviz file {self.path} (closed)>"
        from biasviz.cli.info_cmd import summary
        from biasviz.common.terminal import inert

        return inert(summary(self.path), lines=True)  # a REPL prints it raw: the file's text shown as data

    def plot(self, kind: str = "bias", **options: Any) -> Figure | list[Figure]:
        """The figure ``biasviz plot --kind KIND`` saves for this file; options as :func:`plot`."""
        options.setdefault("scheme", self.scheme)
        return plot(self.path, kind, **options)

    def explore(self, other: str | Path | None = None, **options: Any) -> ExplorerPage:
        """The page ``biasviz explore`` writes (``.save(path)``; shown inline in Jupyter), as ``biasviz.explore``."""
        from biasviz.explorer import explore

        self._f  # noqa: B018 - a closed view explores nothing
        return explore(self.path, other, **options)


def open(path: str | Path) -> View:  # noqa: A001 - biasviz.open, as h5py.File or xarray.open_dataset
    """Open a biasviz file (full, summary or sweep) read-only, with labelled access, xarray and figures."""
    return View(path)


# Python keyword -> the option of `biasviz plot` it sets (flags: True adds the option alone)
_OPTIONS = {"layer": "--layer", "sample": "--sample", "step": "--step", "normalize": "--normalize", "cmap": "--cmap",
            "log": "--log", "log_distance": "--log-distance", "style": "--style", "width": "--width", "dpi": "--dpi",
            "reduce": "--reduce", "max_cells": "--max-cells"}  # fmt: skip


def plot(path: str | Path, kind: str = "bias", *, scheme: str | None = None, shared_scale: bool | None = None,
         **options: Any) -> Figure | list[Figure]:  # fmt: skip
    """The matplotlib figure ``biasviz plot --input PATH --kind KIND`` saves, pixel for pixel, not written anywhere.

    Keywords are the command's options: ``layer``, ``sample`` (an index or 'mean'), ``step``, ``normalize``,
    ``shared_scale``, ``cmap``, ``log``, ``log_distance``, ``style``, ``width``, ``dpi`` (the PNG resolution,
    which also sets how finely large matrices are drawn), ``reduce``, ``max_cells``. Kinds that draw more than
    one figure (``all``, ``profile``, ``std``) return a list. The figure draws itself in the paper style the
    command saves it in, so ``fig.savefig(..., dpi=dpi)`` gives the command's PNG and Jupyter shows it inline.
    """
    import click

    from biasviz.cli.plot_cmd import KEEP_FIGURES
    from biasviz.cli.plot_cmd import plot as command

    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"plot() got unknown option(s) {', '.join(unknown)}; it takes {', '.join(sorted(_OPTIONS))}")
    options = _checked(options)
    if scheme is None:
        with FileView(path) as view:
            scheme = view.scheme
    args = ["--input", str(path), "--kind", kind, "--scheme", scheme]
    for name, value in options.items():
        if value is None or value is False:
            continue
        args += [_OPTIONS[name]] if value is True else [_OPTIONS[name], str(value)]
    if shared_scale is not None:
        args.append("--shared-scale" if shared_scale else "--per-head-scale")
    kept: list[tuple[Figure, str | None]] = []
    try:
        ctx = command.make_context("plot", args)
    except click.ClickException as exc:  # a value the command does not take: the message it would print
        raise UsageError(exc.format_message()) from None
    ctx.meta[KEEP_FIGURES] = kept
    with ctx:
        command.invoke(ctx)
    if not kept:
        raise BiasvizError(f"biasviz plot --kind {kind} drew no figure for {path}")
    figures = [_in_style(fig, style) for fig, style in kept]
    return figures[0] if len(figures) == 1 else figures


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    """The index options as the notebook API takes them everywhere (:mod:`biasviz.common.arguments`): numpy
    integers as integers; a float, a string or a bool one clear TypeError naming the option."""
    from biasviz.common.arguments import ArgumentValueError, whole

    out = dict(options)
    for name, valid in (("layer", "a stored layer, -1 the last"), ("step", "a training step of the sweep")):
        if out.get(name) is not None:
            out[name] = whole(name, out[name], valid)
    sample = out.get("sample")
    if isinstance(sample, str) and sample != "mean":
        raise ArgumentValueError(f"sample must be an index or 'mean', not {sample!r}")
    if sample is not None and not isinstance(sample, str):
        out["sample"] = whole("sample", sample, "an index from 0, or 'mean'")
    return out


def _in_style(fig: Figure, style: str | None) -> Figure:
    """``fig``, drawn from now on inside the paper style it is saved in (the math font and tick sizes are read
    when a figure is drawn), so that it looks the same in a notebook, in ``savefig`` and in the command's file;
    it shows itself in a notebook whether or not pyplot's inline backend was ever loaded."""
    fig.__class__ = __getattr__("StyledFigure")
    fig._biasviz_style = style  # type: ignore[attr-defined]
    return fig


#: A figure shown inline is drawn at this many pixels an inch, and displayed at half that (sharp on HiDPI screens)
INLINE_DPI = 200


def __getattr__(name: str) -> Any:
    """``StyledFigure``, made on first use (matplotlib is imported only by figures) and kept here by its name, so
    that a pickled figure finds its class again."""
    if name != "StyledFigure":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from matplotlib.figure import Figure as _Figure

    from biasviz.plotting.style import paper_context

    class StyledFigure(_Figure):
        """A figure of ``biasviz plot`` that draws itself in the paper style its files are saved in."""

        def draw(self, renderer: Any) -> None:
            if self._biasviz_style is None:
                super().draw(renderer)
                return
            with paper_context(self._biasviz_style):
                super().draw(renderer)

        def savefig(self, *args: Any, **kwargs: Any) -> None:
            """``Figure.savefig`` with the command's font settings: TrueType fonts embedded in PDF and PostScript
            (never Type 3, which some publishers refuse), SVG text kept as text."""
            import matplotlib as mpl

            with mpl.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}):
                super().savefig(*args, **kwargs)

        def _repr_png_(self) -> tuple[bytes, dict[str, int]]:
            """The figure as Jupyter shows it (where pyplot's inline backend has not claimed figures already):
            a PNG at ``INLINE_DPI``, displayed at half its pixels, the printed width on a 100-dpi screen."""
            import io

            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=INLINE_DPI)
            width, height = self.get_size_inches()
            return buffer.getvalue(), {"width": round(width * INLINE_DPI / 2), "height": round(height * INLINE_DPI / 2)}

    StyledFigure.__module__, StyledFigure.__qualname__ = __name__, name
    globals()[name] = StyledFigure
    return StyledFigure


__all__ = ["View", "open", "plot"]
