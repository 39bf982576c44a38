"""The page itself: the template, style and script shipped beside this module, with the data inlined.

Everything the page needs is in the one file: no script, style or font is fetched, so it opens from
disk (``file://``) with no network, in a notebook, or attached to an e-mail.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources

from biasviz.common.names import utf8_data, utf8_text
from biasviz.common.version import __version__
from biasviz.explorer.build import PageData

#: Grid canvases are at most this many pixels a side (each pixel samples the overview).
GRID_PIXELS = 320
#: The enlarged head's canvas, pixels a side (shown smaller where the window is).
FOCUS_PIXELS = 720
#: The page's script, in the order it runs (one function scope: explorer.html wraps them).
SCRIPTS = ("core.js", "draw.js", "measures.js", "export.js", "explorer.js")


def _asset(name: str) -> str:
    return resources.files("biasviz.explorer").joinpath(name).read_text(encoding="utf-8")


def _panels(n_heads: int, seq_len: int) -> str:
    side = min(seq_len, GRID_PIXELS)
    return "\n".join(
        f'<figure class="panel" data-panel="{h}"><figcaption>Head {h}</figcaption><div class="canvases">'
        f'<canvas data-head="{h}" data-source="A" width="{side}" height="{side}"></canvas></div>'
        '<div class="cbar"><span class="lo"></span><canvas class="ramp" width="256" height="11"></canvas>'
        '<span class="hi"></span><div class="ticks"></div></div></figure>'
        for h in range(1, n_heads + 1)
    )


def precision_note(data: PageData) -> str:
    """What the page's numbers are worth, in the words of README's "Explorer" section."""
    p = data.payload
    summary = p.get("summary")
    lead = ""
    if summary:
        blocks = f" over blocks of {summary['block']} x {summary['block']} positions" if summary["block"] > 1 else ""
        over = "the scheme's formula (--bias-only)" if summary["bias_only"] else f"{summary['samples']} samples"
        lead = (f"Summary file: every value is the mean over {over}{blocks} (its causal cells), "
                "as 'extract --summary' stored it; no sample's own matrices. ")  # fmt: skip
    return lead + (
        f"Overviews: {p['overview']} cells a side (block means, 16-bit: 65,535 levels over each head's range, "
        "where they are smaller than the matrix); the grid draws the finest level that the page holds. "
        "Read-out and zoom use the finest level the page holds for that head: 'exact' is the stored float32 "
        "value, '16-bit' is within half a level step (shown), a block mean is the mean of the cells it covers. "
        f"Size budget {p['budget_mb']:g} MB ({data.summary()}). Colour maps as in 'biasviz plot'."
    )


#: The template's placeholders; the page is filled in one pass, so a value is never searched for placeholders.
_PLACEHOLDER = re.compile(r"\{\{([A-Z]+)\}\}")
#: JSON inside <script> must not hold "<" (no "</script>", "<!--" or "<script" can end or bend the element),
#: nor ">" and "&": escaped as JSON unicode escapes, which parse back to the same strings.
_SCRIPT_UNSAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                                "\u2029": "\\u2029"})


def script_json(value: object) -> str:
    """``value`` as JSON that can sit inside a ``<script>`` element whatever strings it holds."""
    return json.dumps(utf8_data(value), separators=(",", ":"), allow_nan=False).translate(_SCRIPT_UNSAFE)


def render_page(data: PageData, title: str) -> str:
    """The complete HTML text: the template's placeholders replaced in one pass (module docstring)."""
    p = data.payload
    parts = {
        "VERSION": html.escape(__version__),
        "TITLE": html.escape(utf8_text(title)),
        "CSS": _asset("explorer.css"),
        "PANELS": _panels(p["n_heads"], p["seq_len"]),
        "FOCUS": str(min(FOCUS_PIXELS, max(p["seq_len"], 256))),
        "PRECISION": html.escape(precision_note(data)),
        "JS": "\n".join(_asset(name) for name in SCRIPTS),
        "DATA": script_json(p),
    }
    return _PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("explorer.html"))


__all__ = ["GRID_PIXELS", "FOCUS_PIXELS", "precision_note", "render_page", "script_json"]
