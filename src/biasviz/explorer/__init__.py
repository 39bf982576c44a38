"""``biasviz explore``: one self-contained, interactive HTML page of one bias file, or two compared.

Python (in Jupyter, ``page`` on its own shows it inline)::

    page = biasviz.explore("data/alibi.h5")
    page.save("figures/alibi_explore.html")

A trace is explored as it is, with no file written first: ``biasviz.explore(t)`` after
``with biasviz.trace(model) as t: model(ids)``.
"""

from __future__ import annotations

import contextlib
import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from biasviz.common.errors import BiasvizError


@dataclass(repr=False)
class ExplorerPage:
    """A built page: ``save`` writes it; in Jupyter it shows inline (``_repr_html_``)."""

    html: str
    title: str
    summary: str

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write the page atomically; an existing file is kept unless ``force`` (as `extract` does)."""
        from biasviz.common.atomic import replacing, write_new

        target = Path(path)
        if target.exists() and not force:
            raise BiasvizError(f"{target} already exists; pass --force to overwrite it or choose another --out")
        if target.parent and not target.parent.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
        with replacing(target, overwrite=force) as tmp:  # a page another process made meanwhile is kept
            write_new(tmp, self.html)
        return target

    def __repr__(self) -> str:  # the page's text is megabytes: a notebook's plain-text form names it instead
        return f"<ExplorerPage {self.title!r}: {self.nbytes / 1e6:.2f} MB, {self.summary}; .save(path) writes it>"

    @property
    def nbytes(self) -> int:
        """The page's size in bytes (UTF-8)."""
        return len(self.html.encode("utf-8"))

    def _repr_html_(self) -> str:
        """The page inline, for Jupyter and VS Code: its own document in an ``<iframe srcdoc>`` (the page's text
        escaped as the attribute's value), so that its script and style cannot touch the notebook's, and nothing
        is fetched or served."""
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title)}" '
                'style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>')  # fmt: skip


def explore(path: str | Path | Any, other: str | Path | Any | None = None, *, kind: str = "all",
            layer: int | None = None, max_mb: float | None = None, tokenizer: str | Path | None = None,
            title: str | None = None, input_ids: Any = None) -> ExplorerPage:  # fmt: skip
    """Build the page for ``path`` (and ``other``, compared as A, B and A - B).

    ``path`` and ``other``: a biasviz file (full, summary or sweep), or a :class:`biasviz.tracing.Trace`, explored
    as it is (its calls of the last call's shape become the page's layers; nothing is written where you see it);
    ``kind``: 'bias', 'weights', 'scores', 'positional' (docs/positional.md) or 'all' (every one the file holds);
    ``layer``: one layer (default: every layer stored; for a trace, a call index, -1 the last);
    ``max_mb``: the size budget (default 14 MB up to 1024 positions, 38 MB beyond);
    ``tokenizer``: a tokenizer.json for the token read-out when the file's own cannot be found (for a trace,
    with ``input_ids``, the (batch, T) ids the model was called with).

    Returns an :class:`ExplorerPage`: ``page.save(path)`` writes it, and in a notebook it shows inline.
    """
    import numbers

    from biasviz.common.arguments import ArgumentTypeError, whole
    from biasviz.common.names import display_name
    from biasviz.explorer.build import KINDS, build_page_data
    from biasviz.explorer.page import render_page
    from biasviz.explorer.traced import is_trace, trace_file

    if kind not in (*KINDS, "all"):
        raise BiasvizError(f"kind must be one of {', '.join(KINDS)} or 'all', not '{kind}'")
    if layer is not None:
        layer = whole("layer", layer, "a stored layer, -1 the last, or None for every layer")
    if max_mb is not None and (isinstance(max_mb, bool) or not isinstance(max_mb, numbers.Real)):
        raise ArgumentTypeError(f"max_mb must be a number of MB, not {max_mb!r} ({type(max_mb).__name__})")
    if max_mb is not None and not 0 < max_mb < math.inf:  # NaN fails this too
        raise BiasvizError(f"the size budget must be a positive, finite number of MB, not {max_mb}")
    if input_ids is not None and not is_trace(path):
        raise BiasvizError("input_ids are for a trace; a file holds its own token ids")
    sources = [path] + ([other] if other is not None else [])
    with contextlib.ExitStack() as stack:
        paths, names = [], []
        for source in sources:
            if is_trace(source):
                paths.append(stack.enter_context(trace_file(source, layer=layer, input_ids=input_ids,
                                                            tokenizer=tokenizer)))  # fmt: skip
                names.append("trace" if source.model is None else f"trace of {type(source.model).__name__}")
            elif isinstance(source, str | Path):
                paths.append(Path(source))
                names.append(display_name(Path(source).stem))  # shown in the page: valid UTF-8
            else:
                raise BiasvizError(f"explore takes a file path or a biasviz.trace, not {type(source).__name__}")
        # a trace's file holds the one call asked for (as a call index, which the file's layers keep)
        traced_layer = None if all(is_trace(s) for s in sources) else layer
        data = build_page_data(paths, kind=kind, layer=traced_layer, max_mb=max_mb, tokenizer=tokenizer)
    page_title = title or f"biasviz explorer: {' vs '.join(names)}"
    return ExplorerPage(render_page(data, page_title), page_title, data.summary())


__all__ = ["ExplorerPage", "explore"]
