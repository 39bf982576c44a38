"""``biasviz explore``: one self-contained, interactive HTML page of one bias file, or two compared.

Python (in Jupyter, ``page`` on its own shows it inline)::

    page = biasviz.explore("data/alibi.h5")
    page.save("figures/alibi_explore.html")
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from biasviz.common.errors import BiasvizError


@dataclass
class ExplorerPage:
    """A built page: ``save`` writes it; in Jupyter it shows inline (``_repr_html_``)."""

    html: str
    title: str
    summary: str

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write the page atomically; an existing file is kept unless ``force`` (as `extract` does)."""
        from biasviz.common.atomic import replacing

        target = Path(path)
        if target.exists() and not force:
            raise BiasvizError(f"{target} already exists; pass --force to overwrite it or choose another --out")
        if target.parent and not target.parent.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with replacing(target, overwrite=force) as tmp:
                tmp.write_text(self.html, encoding="utf-8")
        except FileExistsError:
            raise BiasvizError(f"{target} appeared while the page was written; pass --force to overwrite it") from None
        return target

    @property
    def nbytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def _repr_html_(self) -> str:
        # its own document in a frame: the page's script and style cannot touch the notebook's
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title)}" '
                'style="width: 100%; height: 900px; border: 1px solid #ddd;"></iframe>')  # fmt: skip


def explore(path: str | Path, other: str | Path | None = None, *, kind: str = "all", layer: int | None = None,
            max_mb: float | None = None, tokenizer: str | Path | None = None,
            title: str | None = None) -> ExplorerPage:  # fmt: skip
    """Build the page for ``path`` (and ``other``, compared as A, B and A - B).

    ``kind``: 'bias', 'weights', 'scores', 'positional' (SPEC section 12) or 'all' (every one the file holds);
    ``layer``: one layer (default: every layer stored);
    ``max_mb``: the size budget (default 14 MB up to 1024 positions, 38 MB beyond);
    ``tokenizer``: a tokenizer.json for the token read-out when the file's own cannot be found.
    """
    from biasviz.explorer.build import KINDS, build_page_data
    from biasviz.explorer.page import render_page

    if kind not in (*KINDS, "all"):
        raise BiasvizError(f"kind must be one of {', '.join(KINDS)} or 'all', not '{kind}'")
    if max_mb is not None and not 0 < max_mb < math.inf:  # NaN fails this too
        raise BiasvizError(f"the size budget must be a positive, finite number of MB, not {max_mb}")
    paths = [Path(path)] + ([Path(other)] if other is not None else [])
    data = build_page_data(paths, kind=kind, layer=layer, max_mb=max_mb, tokenizer=tokenizer)
    names = " vs ".join(p.stem for p in paths)
    page_title = title or f"biasviz explorer: {names}"
    return ExplorerPage(render_page(data, page_title), page_title, data.summary())


__all__ = ["ExplorerPage", "explore"]
