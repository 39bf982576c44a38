"""Write figures atomically with paper settings and provenance in the file's metadata."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine

from biasviz.common.atomic import Staged, replacing
from biasviz.common.errors import BiasvizError, os_error_message, underlying_os_error
from biasviz.common.names import utf8_text
from biasviz.common.outputs import make_output_folder
from biasviz.common.version import __version__
from biasviz.plotting.style import DEFAULT_STYLE, paper_context

FORMATS = ("pdf", "png", "svg")
#: Resolution of the rasterized heatmaps inside vector files (PDF, SVG).
VECTOR_RASTER_DPI = 300
#: Settings every file is written with: TrueType fonts embedded whole (no Type 3), SVG text as text
SAVE_RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none", "svg.hashsalt": "biasviz"}


def parse_formats(text: str) -> list[str]:
    """``'pdf,png'`` -> ``['pdf', 'png']``; unknown names are an error."""
    names = [f.strip().lower().lstrip(".") for f in text.split(",") if f.strip()]
    bad = [f for f in names if f not in FORMATS]
    if bad or not names:
        raise BiasvizError(f"unknown figure format(s) {', '.join(bad) or '(none)'}; choose from {', '.join(FORMATS)}")
    return list(dict.fromkeys(names))


def save_figure(fig: Figure, stem: str | Path, formats: Sequence[str], *, dpi: float = 200,
                info: Mapping[str, str] | None = None, style: str | None = DEFAULT_STYLE,
                staged: Staged | None = None) -> list[Path]:  # fmt: skip
    """Save ``fig`` as ``stem.<format>`` for each format and return the paths.

    Each file is written under a temporary name beside its target and moved into place when complete,
    so an interrupted run leaves earlier figures intact; with ``staged``, only when the whole set is
    (:func:`biasviz.common.atomic.replacing_together`). ``info`` (title, description, source,
    keywords) goes into the PDF document info, the PNG text chunks or the SVG metadata. ``style``
    applies the paper settings read at save time (math font, font embedding); None keeps the caller's.
    """
    stem = Path(stem)
    make_output_folder(stem.parent, "--out-dir")
    paths = []
    with _laid_out_once(fig, style, len(formats)):
        for fmt in formats:
            target = stem.with_name(f"{stem.name}.{fmt}")
            with paper_context(style) if style else contextlib.nullcontext():
                _save_one(fig, target, fmt, dpi if fmt == "png" else VECTOR_RASTER_DPI, dict(info or {}), staged)
            paths.append(target)
    return paths


@contextlib.contextmanager
def _laid_out_once(fig: Figure, style: str | None, files: int) -> Iterator[None]:
    """With more than one file to write, the layout engine (constrained layout: a second of text measuring for a
    12-head grid) runs once, and every file is drawn with the positions it found: the PDF and the PNG of a figure
    then also have the same layout. The engine is back in place afterwards (a notebook's figure still resizes).

    Meanwhile the figure holds no engine at all: matplotlib's placeholder for "none" still has ``savefig`` draw the
    whole figure once before it draws the file (a sixth of a 12-head grid's save), to lay out what is laid out."""
    engine = fig.get_layout_engine()
    if files < 2 or engine is None or isinstance(engine, PlaceHolderLayoutEngine):
        yield
        return
    with paper_context(style) if style else contextlib.nullcontext(), mpl.rc_context(SAVE_RC):
        fig.draw_without_rendering()
    fig.set_layout_engine("none")
    placeholder = fig.get_layout_engine()
    fig._layout_engine = None  # no public way back to None once an engine was set
    try:
        yield
    finally:
        fig._layout_engine = placeholder
        fig.set_layout_engine(engine)


def _metadata(fmt: str, info: dict[str, str]) -> dict[str, object]:
    """The format's metadata; names that are not UTF-8 (the input file's) escaped, as PNG, PDF and SVG need."""
    info = {key: utf8_text(str(value)) for key, value in info.items()}
    title, desc = info.get("title", ""), info.get("description", "")
    source, keywords = info.get("source", ""), info.get("keywords", "")
    creator = f"biasviz {__version__}"
    if fmt == "pdf":  # no creation date: the same input gives the same bytes
        return {"Title": title, "Subject": desc, "Keywords": keywords, "Creator": creator, "CreationDate": None}
    if fmt == "svg":
        return {"Title": title, "Description": desc, "Source": source, "Keywords": keywords, "Creator": creator,
                "Date": None}  # fmt: skip
    return {"Title": title, "Description": desc, "Source": source, "Keywords": keywords, "Software": creator}


def _save_one(fig: Figure, target: Path, fmt: str, dpi: float, info: dict[str, str], staged: Staged | None) -> None:
    rc = SAVE_RC
    writing = replacing(target) if staged is None else contextlib.nullcontext(staged.temporary(target))
    try:
        with writing as tmp, mpl.rc_context(rc):
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=_metadata(fmt, info))
    except Exception as exc:  # a full disk can surface as another error of the backend's (PDF: AttributeError)
        cause = underlying_os_error(exc)
        if cause is None:
            raise
        raise BiasvizError(os_error_message(cause, target)) from exc


__all__ = ["FORMATS", "VECTOR_RASTER_DPI", "parse_formats", "save_figure"]
