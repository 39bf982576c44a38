"""Paper styles: figure widths of common venues and a matplotlib context with ~9 pt text.

Figures are sized to the printed text width, so that ``\\includegraphics[width=\\textwidth]`` prints
the text at the size set here. Styles apply only inside :func:`paper_context`; nothing global changes.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from biasviz.common.errors import BiasvizError

#: Printed width in inches of each venue's text (``-column``: one column of a two-column page).
VENUE_WIDTHS: dict[str, float] = {
    "neurips": 5.5,
    "iclr": 5.5,
    "acl": 6.3,
    "acl-column": 3.0,
    "icml": 6.75,
    "icml-column": 3.25,
}
DEFAULT_STYLE = "neurips"

#: The text face: STIX, Times-like as these venues' text, shipped with matplotlib as TrueType files, and the face of
#: its math text (``mathtext.fontset = stix``), so that text and formulas match and every machine draws the same
#: figure. A system Times is not taken: Nimbus Roman and TeX Gyre Termes are CFF (OpenType) fonts, which a PDF
#: embeds as "CID Type 0C" where poppler warns "Mismatch between font type and embedded font file".
_SERIF = ["STIXGeneral"]


#: Widths ``--width INCHES`` takes: a figure narrower than 2 in has no room for 12 heads, wider than 10 in no page.
WIDTH_RANGE = (2.0, 10.0)


def venue_width(style: str) -> float:
    """Printed width in inches for a style name, e.g. ``venue_width('icml') == 6.75``, or for a width given as
    such (``'3.5in'``, what :func:`with_width` makes of ``--width 3.5``)."""
    key = style.strip().lower()
    if key.endswith("in") and key[:-2].replace(".", "", 1).isdigit():
        return float(key[:-2])
    if key not in VENUE_WIDTHS:
        raise BiasvizError(f"unknown style '{style}'; valid styles: {', '.join(VENUE_WIDTHS)}")
    return VENUE_WIDTHS[key]


def with_width(style: str, width: str | None) -> str:
    """The style ``--style STYLE --width column|page|INCHES`` asks for: the venue's one-column or full text width,
    or a width of its own (fonts as :func:`font_sizes` gives them for it: never below 6 pt).

    >>> with_width("icml", "column"), with_width("icml-column", "page"), with_width("neurips", "3.5")
    ('icml-column', 'icml', '3.5in')
    """
    if width is None:
        return style
    venue = style.removesuffix("-column")
    choice = width.strip().lower()
    if choice == "page":
        return venue
    if choice == "column":
        if f"{venue}-column" not in VENUE_WIDTHS:
            columns = ", ".join(k.removesuffix("-column") for k in VENUE_WIDTHS if k.endswith("-column"))
            raise BiasvizError(f"--width column: {venue} prints one column (its page width is the column); "
                               f"venues with two columns: {columns}; or give --width INCHES")  # fmt: skip
        return f"{venue}-column"
    try:
        inches = float(choice.removesuffix("in"))
    except ValueError:
        raise BiasvizError(f"--width takes column, page or a width in inches, not {width!r}") from None
    lo, hi = WIDTH_RANGE
    if not lo <= inches <= hi:
        raise BiasvizError(f"--width {width}: give a width from {lo:g} to {hi:g} inches")
    return f"{inches:g}in"


def font_sizes(width: float) -> dict[str, float]:
    """Text sizes in points: 9 pt titles, 7 pt ticks; one step smaller for one-column widths."""
    if width < 4.0:
        return {"base": 8.0, "title": 8.0, "tick": 6.0}
    return {"base": 9.0, "title": 9.0, "tick": 7.0}


def _serif_family() -> str:
    """The first installed font of ``_SERIF`` whose outlines are TrueType, named concretely so that text keeps it
    when saved elsewhere (a matplotlib without its STIX files: its default serif, DejaVu Serif, also TrueType)."""
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist if truetype_outlines(f.fname)}
    return next((name for name in _SERIF if name in installed), "DejaVu Serif")


def truetype_outlines(path: str) -> bool:
    """Whether the font file at ``path`` holds TrueType outlines (what ``pdf.fonttype = 42`` embeds cleanly), not
    CFF ones (an OpenType ``OTTO`` file), read from its first bytes (a collection: its first font's)."""
    try:
        with open(path, "rb") as f:
            tag = f.read(4)
            if tag == b"ttcf":
                f.seek(12)
                f.seek(int.from_bytes(f.read(4), "big"))
                tag = f.read(4)
    except OSError:
        return False
    return tag in (b"\x00\x01\x00\x00", b"true")


def _rc(width: float) -> dict[str, object]:
    sizes = font_sizes(width)
    return {
        "font.family": _serif_family(),
        "font.serif": [*_SERIF, "DejaVu Serif"],
        "mathtext.fontset": "stix",
        "font.size": sizes["base"],
        "axes.titlesize": sizes["title"],
        "axes.labelsize": sizes["base"],
        "xtick.labelsize": sizes["tick"],
        "ytick.labelsize": sizes["tick"],
        "legend.fontsize": sizes["tick"],
        "axes.linewidth": 0.5,
        "xtick.major.width": 0.5,
        "ytick.major.width": 0.5,
        "xtick.major.size": 2.0,
        "ytick.major.size": 2.0,
        "xtick.major.pad": 1.5,
        "ytick.major.pad": 1.5,
        "axes.titlepad": 3.0,
        "lines.linewidth": 1.0,
        "pdf.fonttype": 42,  # TrueType: text stays selectable and editable in the PDF
        "ps.fonttype": 42,
        "svg.fonttype": "none",  # SVG text as text, typeset in the paper's own font
        "savefig.dpi": 300,
        "image.interpolation": "nearest",
        "axes.unicode_minus": True,
    }


def literal(text: str) -> str:
    """``text`` (a scheme name read from a file, say) drawn as the characters it holds: a ``$`` would start
    matplotlib's math mode, and a malformed formula there stops the whole figure.

    >>> print(literal("50% $x^$"))
    50% \\$x^\\$
    """
    return str(text).replace("$", r"\$")


#: A space beside a relation or an operator between two terms ("T = 64", "i − j", "d ≤ 8"), or in a count with its noun
#: ("sample 1 of 3"): a line never breaks there, so a title never reads "T" at the end of a line and "= 64" at the start
#: of the next
_BOUND = re.compile(r"(?<=\S) [=≠<>≤≥≈−+×·] (?=\S)|(?<=\d) of (?=\d)|(?<=[A-Za-z]) (?=\d+ of \d)")
_NO_BREAK = "\u00a0"  # not a place where textwrap breaks (it breaks at ASCII whitespace only)


def wrap_title(text: str, width_in: float, size: float | None = None) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``size`` points (serif text averages about
    half an em per character), so that a figure's title never runs past its edges at a narrow style; a line breaks
    between terms, never inside "name = value" (:data:`_BOUND`)."""
    import textwrap

    size = size or font_sizes(width_in)["base"]
    bound = _BOUND.sub(lambda m: m.group(0).replace(" ", _NO_BREAK), text)
    wrapped = textwrap.fill(bound, max(20, int(width_in * 72 / (0.47 * size))), break_on_hyphens=False)
    return wrapped.replace(_NO_BREAK, " ")


@contextlib.contextmanager
def paper_context(style: str = DEFAULT_STYLE) -> Iterator[float]:
    """Apply the paper rc settings inside a ``with`` block; yields the figure width in inches."""
    import matplotlib as mpl  # here, so that the CLI can list the styles without importing matplotlib

    width = venue_width(style)
    font_logger = logging.getLogger("matplotlib.font_manager")
    level = font_logger.level
    font_logger.setLevel(logging.ERROR)  # a glyph STIX lacks falls back to DejaVu quietly
    try:
        with mpl.rc_context(_rc(width)):
            yield width
    finally:
        font_logger.setLevel(level)


__all__ = ["VENUE_WIDTHS", "DEFAULT_STYLE", "venue_width", "with_width", "font_sizes", "literal", "paper_context",
           "truetype_outlines", "wrap_title"]
