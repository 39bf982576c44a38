"""``biasviz.open`` and ``biasviz.plot``: the commands' files and figures where researchers work, in Python.

:class:`View` adds to the store's read-only :class:`~biasviz.store.view.FileView` what sits above the store: the
figures of ``biasviz plot`` (drawn by the library the command calls, :func:`biasviz.plotting.draw.figures`, every
check included, and returned instead of written), the page of ``biasviz explore``, and the text of ``biasviz info``
as its ``repr``. No command runs: the command is one caller of the same library, this module another.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasviz.common.errors import BiasvizError
from biasviz.store.view import FileView

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from biasviz.explorer import ExplorerPage


class View(FileView):
    """A biasviz file opened read-only (see :class:`FileView`), with its figures and explorer page."""

    def __repr__(self) -> str:
        if self._closed:
            return f"<biasviz file {self.path} (closed)>"
        from biasviz.common.terminal import inert
        from biasviz.store.describe import summary

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


def plot(path: str | Path, kind: str = "bias", *, scheme: str | None = None, shared_scale: bool | None = None,
         **options: Any) -> Figure | list[Figure]:  # fmt: skip
    """The matplotlib figure ``biasviz plot --input PATH --kind KIND`` saves, pixel for pixel, not written anywhere.

    Keywords are the command's options: ``layer``, ``sample`` (an index or 'mean'), ``step``, ``normalize``,
    ``shared_scale``, ``cmap``, ``log``, ``log_distance``, ``style``, ``width``, ``dpi`` (the PNG resolution,
    which also sets how finely large matrices are drawn), ``reduce``, ``max_cells``. Kinds that draw more than
    one figure (``all``, ``profile``, ``std``) return a list. The figure draws itself in the paper style the
    command saves it in, so ``fig.savefig(..., dpi=dpi)`` gives the command's PNG and Jupyter shows it inline.
    """
    from biasviz.notebook.options import OPTIONS, checked, command_values
    from biasviz.plotting.draw import figures

    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"plot() got unknown option(s) {', '.join(unknown)}; it takes {', '.join(sorted(OPTIONS))}")
    options = checked(options)
    if scheme is None:
        with FileView(path) as view:
            scheme = view.scheme
    file, values = command_values(path, kind, options)
    kept = figures(file, kind, scheme=scheme, shared_scale=None if shared_scale is None else bool(shared_scale),
                   **values)  # fmt: skip
    if not kept:
        raise BiasvizError(f"biasviz plot --kind {kind} drew no figure for {path}")
    drawn = [_in_style(fig, style) for fig, style in kept]
    return drawn[0] if len(drawn) == 1 else drawn


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
