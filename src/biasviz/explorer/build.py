"""What the page shows, read from one or two format-1 files: every (source, layer, kind, sample) set of heads.

Each head travels as a pyramid: a coarse overview (at most :data:`OVERVIEW` cells per axis, 16-bit, always
there) for the grid, and as much detail as the size budget allows (:mod:`.detail`): every head its full matrix
(16-bit codes) before any head is made exact (float32 bits), and block means only where a full matrix does not
fit, so that an enlarged head is drawn cell by cell wherever the budget allows it.
The overviews and profiles are packed first, so that the detail passes know exactly what is left. Detail goes
to the sets in order: the checkpoint a sweep opens on (its last) before the others, and within one checkpoint
the first sample (the page opens on it), the mean over samples, the other samples; the heads of a set share
equally what is left when the set's turn comes, and what one head does not use (a bias that depends on i - j
alone packs to almost nothing) passes on.

Two files compared: A and B share the budget head by head (A's head h, then B's), and the difference A - B
travels as no matrix at all: the page subtracts B's cells from A's at the finest level both hold, so a
comparison costs what its two files cost. Only A - B's colour scales (from every cell, by the figures' rules:
diverging around 0 where the difference changes sign) and distance profiles are packed here.

Colour scales are computed from every cell of each head at full resolution (:class:`ValueRange`, taken while
the heads stream past), so a page's colour limits are the data's extremes, as ``biasviz plot``'s are.

A summary file (``extract --summary``) shows its block-mean maps, the mean over samples only: each level's
factor ``f`` stays in positions (a map of blocks of B positions is level ``f = B``), so the page reads cells
by position exactly as for a full file; coarser levels weigh each block by the cells it averages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.common.names import display_name
from biasviz.explorer.detail import give_detail, precision_counts
from biasviz.explorer.encode import pack_bytes, pack_exact, pack_quantised
from biasviz.explorer.measures import layer_measures
from biasviz.explorer.profiles import distance_profile, profile_json, scale_json
from biasviz.explorer.tokens import find_tokenizer, token_strings
from biasviz.plotting.load import iter_heads
from biasviz.plotting.reduce import block_reduce, weighted_block_mean
from biasviz.plotting.scales import ValueRange
from biasviz.store import BiasFile, open_bias_file
from biasviz.store.datasets import POSITIONAL_PROFILE, map_name

#: Largest overview (cells per axis) drawn in the grid; always embedded.
OVERVIEW = 256
#: The overviews of every set take at most this share of the budget: past it they are made coarser (exact,
#: then 16-bit, then blocks twice as large), down to :data:`MIN_OVERVIEW` cells a side.
OVERVIEW_SHARE = 0.5
MIN_OVERVIEW = 64
KINDS = ("bias", "weights", "scores", "positional")  # what a page can switch between (docs/positional.md: the last two)
MB = 1_000_000


def default_budget_mb(seq_len: int) -> float:
    """Default size budget of a page: 14 MB up to 1024 positions, 38 MB beyond (README, "Explorer")."""
    return 14.0 if seq_len <= 1024 else 38.0


@dataclass
class PageData:
    """The page's data as JSON-ready values, and a one-line summary of the precision it holds."""

    payload: dict[str, Any]
    precision: dict[str, int] = field(default_factory=dict)
    over_budget: float = 0.0  # MB the overviews alone need beyond the budget (they are never left out)

    def summary(self) -> str:
        parts = [f"{n} {what}" for what, n in sorted(self.precision.items())]
        over = f"; the overviews alone pass the size budget by {self.over_budget:.2f} MB" if self.over_budget else ""
        return "heads by detail: " + ", ".join(parts) + over


def build_page_data(paths: list[Path], *, kind: str = "all", layer: int | None = None,
                    max_mb: float | None = None, tokenizer: str | Path | None = None) -> PageData:  # fmt: skip
    """Read ``paths`` (one file, or two to compare as A, B and A - B) into the page's data."""
    if not 1 <= len(paths) <= 2:
        raise BiasvizError("explore takes one file, or two to compare")
    with ExitStack() as stack:
        files = [stack.enter_context(open_bias_file(p)) for p in paths]
        return _Builder(files, kind, layer, max_mb, tokenizer).build()


class _Builder:
    """Checks what the files can show together, then packs every set in two passes (module docstring)."""

    def __init__(self, files: list[BiasFile], kind: str, layer: int | None, max_mb: float | None,
                 tokenizer: str | Path | None) -> None:  # fmt: skip
        self.files = files
        a = files[0]
        for b in files[1:]:
            if (b.n_heads, b.seq_len, b.causal) != (a.n_heads, a.seq_len, a.causal):
                raise BiasvizError(
                    f"{a.path} ({a.n_heads} heads, {a.seq_len} positions) and {b.path} ({b.n_heads} heads, "
                    f"{b.seq_len} positions) cannot be compared cell by cell"
                )
            if (a.is_summary, a.block) != (b.is_summary, b.block):
                what = {f.path: f"a summary in blocks of {f.block}" if f.is_summary else "a full file" for f in files}
                raise BiasvizError(f"{a.path} is {what[a.path]} and {b.path} {what[b.path]}: they cannot be compared "
                                   "block by block; compare two full files or two summaries of one resolution")
        self.steps = self._steps()
        #: the checkpoints shown (indices into a sweep's steps), or [None] for a file of one model
        self.checkpoints: list[int | None] = list(range(len(self.steps))) if self.steps else [None]
        self.opening = self.checkpoints[-1]  # a sweep opens on its last checkpoint, as every reader does
        self.summary = a.summary  # both files' layouts agree (checked above)
        self.block = a.block or 1
        self.layers = self._layers(layer)
        self.kinds = self._kinds(kind)
        self.tokenizer = tokenizer
        mb = default_budget_mb(a.seq_len) if max_mb is None else max_mb
        self.budget_mb = mb
        self.precision: dict[str, int] = {}

    # -- what to show ------------------------------------------------------------------------------
    def _steps(self) -> list[int] | None:
        steps = [f.checkpoints for f in self.files]
        if any(s != steps[0] for s in steps):
            what = ["steps " + ", ".join(map(str, s)) if s else "one model, no checkpoints" for s in steps]
            raise BiasvizError(f"{self.files[0].path} ({what[0]}) and {self.files[1].path} ({what[1]}) cannot be "
                               "compared step by step; compare two sweeps of the same steps, or two single files")
        return steps[0]

    def _layer_name(self, layer: int) -> str:
        """How the page names ``layer``: "layer 3", or a traced model's "attention call 3 (its module)", since its
        layers are its calls (docs/models.md); each file's module where two files' differ. Text, never markup."""
        from biasviz.plotting.titles import made_by

        owners = [made_by(f, layer) for f in self.files]
        if all(owner is None for owner in owners):
            return f"layer {layer}"
        said = ["a layer" if owner is None else owner or "the model itself" for owner in owners]
        if len(set(said)) == 1:
            return f"attention call {layer} ({said[0]})"
        labels = ", ".join(f"{label}: {owner}" for label, owner in zip("AB", said, strict=False))
        return f"attention call {layer} ({labels})"

    def _layers(self, layer: int | None) -> list[int]:
        if layer is not None:
            resolved = [f.resolve_layer(layer) for f in self.files]
            if len(set(resolved)) > 1:
                raise BiasvizError(f"layer {layer} means different layers in the two files ({resolved}); "
                                   "give a non-negative index")  # fmt: skip
            return resolved[:1]
        common = sorted(set.intersection(*(set(f.layers) for f in self.files)))
        if not common:
            raise BiasvizError(f"{self.files[0].path} and {self.files[1].path} hold no layer in common")
        return common

    def _kinds(self, kind: str) -> list[str]:
        available = [k for k in KINDS if all(self._has(f, k) for f in self.files)]
        wanted = list(KINDS) if kind == "all" else [kind]
        chosen = [k for k in wanted if k in available]
        if not chosen:
            what = " and ".join(str(f.path) for f in self.files)
            other = "bias" if kind == "weights" else "weights"
            raise BiasvizError(f"{what} hold no {kind if kind != 'all' else 'bias or weights'} in layer "
                               f"{self.layers[0]}; try --kind {other}")  # fmt: skip
        return chosen

    def _has(self, f: BiasFile, kind: str) -> bool:
        if kind == "weights":
            return not f.bias_only
        if kind == "scores":
            return all(f.has_scores(layer) for layer in self.layers)
        if kind == "positional":  # a summary of two samples or more
            return f.is_summary and all(f.has_positional(layer) for layer in self.layers)
        return all(f.has_bias(layer) for layer in self.layers)

    def _samples(self, f: BiasFile | None) -> list[int | str]:
        if self.summary is not None:
            return ["mean"]  # a summary holds no sample's own matrices
        n = min(x.n_samples for x in self.files) if f is None else f.n_samples
        return [*range(n), "mean"] if n > 1 else [0]

    def _reduce(self, m: np.ndarray, factor: int) -> np.ndarray:
        """Block means of ``factor`` x ``factor`` cells; a summary's blocks weighted by the cells they average."""
        if factor == 1 or self.summary is None:
            return block_reduce(m, factor)
        return weighted_block_mean(m, self.summary.counts, factor)

    def _cells(self) -> int:
        """Cells per axis of the matrices shown: positions, or a summary's blocks."""
        return self.files[0].seq_len if self.summary is None else self.summary.n_blocks

    def _sources(self) -> list[tuple[str, BiasFile | None]]:
        if len(self.files) == 1:
            return [("A", self.files[0])]
        return [("A", self.files[0]), ("B", self.files[1]), ("D", None)]

    # -- building ----------------------------------------------------------------------------------
    def build(self) -> PageData:
        head = self._header()
        cells = self._cells()
        self.overview = (overview_factor(cells), overview_factor(cells) == 1)  # (block factor, exact)
        while True:  # the first pass: every set's overviews, as fine as half the budget allows
            sets = {_key(label, c, layer, kind, sample): self._overviews(label, f, c, layer, kind, sample)
                    for c in self.checkpoints for label, f in self._sources() for layer in self.layers
                    for kind in self.kinds for sample in self._samples(f)}  # fmt: skip
            size = sum(len(json.dumps(v)) for v in sets.values())
            coarser = _coarser(self.overview, cells)
            if size <= OVERVIEW_SHARE * self.budget_mb * MB or coarser is None:
                break
            self.overview = coarser
        head["overview"] = math.ceil(cells / self.overview[0])
        left = self.budget_mb * MB - len(json.dumps(head)) - size
        if not self.overview[1]:  # else every overview is the exact matrix already
            left = give_detail(sets, self._detail_groups(), _key, self._matrices, self._reduce, self.block, left)
        self.precision = precision_counts(sets, self.block)
        return PageData({**head, "sets": sets}, self.precision, over_budget=max(0.0, -left / MB))

    def _detail_groups(self) -> list[tuple[tuple[Any, ...], list[tuple[str, BiasFile]]]]:
        """(checkpoint, layer, kind, sample) and the files holding it, in the order detail is given out."""
        groups: dict[tuple[Any, ...], list[tuple[str, BiasFile]]] = {}
        for c in self.checkpoints:
            for label, f in self._sources():
                for layer in self.layers:
                    for kind in self.kinds:
                        for sample in self._samples(f) if f is not None else []:
                            groups.setdefault((c, layer, kind, sample), []).append((label, f))
        return sorted(groups.items(), key=lambda g: (g[0][0] != self.opening, _priority(g[0][3])))  # stable

    def _header(self) -> dict[str, Any]:
        from biasviz.explorer.colors import colormap_tables, masked_colors
        from biasviz.plotting.heatmap import DEFAULT_CMAPS

        a = self.files[0]
        names = {"A": "A", "B": "B", "D": "A - B"}
        sources = [{"label": label, "name": names[label],
                    "path": display_name(f.path) if f is not None else "", "scheme": f.scheme if f is not None else "",
                    "samples": [str(s) for s in self._samples(f)]} for label, f in self._sources()]  # fmt: skip
        return {
            "format": 1,
            "n_heads": a.n_heads,
            "seq_len": a.seq_len,
            "causal": a.causal,
            # each layer's own rule where the model's calls differ (an encoder-decoder's decoder self-attention)
            "layer_causal": {str(layer): a.layer_causal(layer) for layer in self.layers},
            "layers": self.layers,
            "layer_names": {str(layer): self._layer_name(layer) for layer in self.layers},
            "kinds": self.kinds,
            "sources": sources,
            "steps": self.steps,
            "opening": self.opening,
            "budget_mb": self.budget_mb,
            "overview": OVERVIEW,
            "summary": None if self.summary is None else {"block": self.block, "samples": a.n_samples,
                                                           "bias_only": a.bias_only},  # fmt: skip
            "cmaps": colormap_tables(),
            "masked": masked_colors(),
            "diverging": DEFAULT_CMAPS["diverging"],
            "tokens": {label: self._tokens(f) for label, f in self._sources() if f is not None},
        }

    def _tokens(self, f: BiasFile) -> dict[str, Any]:
        if f.is_summary:  # the page shows means over samples: no one sample's tokens to read out
            return {"ids": None, "strings": {}, "tokenizer": "none (a summary file: means over samples)"}
        ids = f.input_ids().astype(np.int32)
        if f.bias_only or (ids < 0).all():
            return {"ids": None, "strings": {}, "tokenizer": "none (the file holds the bias only, no text)"}
        tok, where = find_tokenizer(f.attrs, self.tokenizer)
        strings = token_strings(tok, ids.ravel()) if tok is not None else {}
        return {"ids": pack_bytes(ids.astype("<i4").tobytes()), "strings": {str(k): v for k, v in strings.items()},
                "tokenizer": where}  # fmt: skip

    def _overviews(self, label: str, f: BiasFile | None, c: int | None, layer: int, kind: str,
                   sample: int | str) -> dict[str, Any]:  # fmt: skip
        """A set's colour scales, and each head's overview and distance profile (first pass).

        A - B (``f`` None) gets scales and profiles only: the page derives its cells from A's and B's."""
        from biasviz.plotting.scales import ZERO_BELOW, head_scales

        heads, ranges = [], []
        profiles = self._stored_profiles(f, c, layer, kind)
        # the measures of docs/position-measures.md, where held
        measures = None if f is None else layer_measures(_at(f, c), layer, kind)
        for h, m in enumerate(self._matrices(f, c, layer, kind, sample)):
            ranges.append(ValueRange.of(m, ValueRange.needs_percentile(kind)))  # every cell: the data's extremes
            levels = []
            if f is not None:
                top, exact = self.overview
                overview = (replace(pack_exact(m), factor=self.block) if exact
                            else pack_quantised(self._reduce(m, top), top * self.block))  # fmt: skip
                levels.append(overview.as_json())
            profile = distance_profile(m) if profiles is None else profile_json(profiles, h)
            head = {"levels": levels, "profile": profile}
            if measures is not None:
                head["measures"] = measures[h]
            heads.append(head)
        scale_kind = "bias" if f is None else kind  # A - B: the figures' rules (diverging where it changes sign)
        zero = [max(abs(r.lo), abs(r.hi)) < ZERO_BELOW for r in ranges]  # 0 within rounding: said, not drawn to 1
        linear = head_scales([], scale_kind, ranges=ranges)
        shared = head_scales([], scale_kind, shared_scale=True, ranges=ranges)[0]
        top = max(r.hi for r in ranges)  # a weights scale ends at the 99.5th percentile: values above it are said
        scales = {"head": [scale_json(s, z, over=s[0].vmax < r.hi) for s, z, r in zip(linear, zero, ranges,
                                                                                        strict=True)],
                  "shared": scale_json(shared, all(zero), over=shared[0].vmax < top)}  # fmt: skip
        if scale_kind == "weights":  # heavy-tailed: the page offers plot's --log scale too
            scales["log_head"] = [scale_json(s) for s in head_scales([], "weights", log=True, ranges=ranges)]
            scales["log_shared"] = scale_json(head_scales([], "weights", shared_scale=True, log=True,
                                                           ranges=ranges)[0])  # fmt: skip
        return {"heads": heads, "scale": scales}

    def _stored_profiles(self, f: BiasFile | None, c: int | None, layer: int,
                         kind: str) -> tuple[np.ndarray, ...] | None:  # fmt: skip
        """A summary's stored profiles (mean, std, start); for A - B the difference of the means."""
        if self.summary is None:
            return None
        if f is not None:
            return (*_profile(_at(f, c), kind, layer), self.summary.profile_start)
        (ma, _), (mb, _) = (_profile(_at(x, c), kind, layer) for x in self.files)
        return ma - mb, np.zeros_like(ma), self.summary.profile_start  # no spread over samples of a difference

    def _heads_of(self, f: BiasFile, layer: int, kind: str, sample: int | str) -> Iterator[np.ndarray]:
        if f.is_summary:
            yield from f.summary_map(map_name(kind), layer)
        else:
            yield from iter_heads(f, kind, layer=layer, sample=sample)

    def _matrices(self, f: BiasFile | None, c: int | None, layer: int, kind: str,
                  sample: int | str) -> Iterator[np.ndarray]:  # fmt: skip
        if f is not None:
            yield from self._heads_of(_at(f, c), layer, kind, sample)
            return
        a, b = (self._heads_of(_at(x, c), layer, kind, sample) for x in self.files)
        for ma, mb in zip(a, b, strict=True):
            yield ma - mb


def _profile(f: BiasFile, kind: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """A summary's stored (mean, std) by distance; P has no spread over samples (one matrix for all of them)."""
    if kind == "positional":
        mean = f.summary_array(POSITIONAL_PROFILE, layer)[0]  # over all keys
        return mean, np.zeros_like(mean)
    return f.profile(kind, layer)


def _key(label: str, c: int | None, layer: int, kind: str, sample: int | str) -> str:
    """A set's name in the page: ``A|3|bias|0``; a sweep's checkpoint index last (``A|3|bias|0|2``)."""
    return f"{label}|{layer}|{kind}|{sample}" + ("" if c is None else f"|{c}")


def _coarser(overview: tuple[int, bool], cells: int) -> tuple[int, bool] | None:
    """The next smaller overview: exact -> 16-bit -> blocks twice as large; None below MIN_OVERVIEW cells."""
    factor, exact = overview
    if exact:
        return factor, False
    return None if math.ceil(cells / (2 * factor)) < MIN_OVERVIEW else (2 * factor, False)


def _at(f: BiasFile, c: int | None) -> BiasFile:
    """``f`` showing checkpoint ``c`` of a sweep (``f`` itself for a file of one model)."""
    return f if c is None else f.at_checkpoint(c)


def _priority(sample: int | str) -> int:
    """Detail goes first to the sample a page opens on, then to the mean, then to the other samples."""
    return 0 if sample == 0 else 1 if sample == "mean" else 2


def overview_factor(seq_len: int) -> int:
    """The power-of-two block size that brings ``seq_len`` to at most :data:`OVERVIEW` cells per axis.

    >>> overview_factor(64), overview_factor(1024), overview_factor(1000)
    (1, 4, 4)
    """
    factor = 1
    while math.ceil(seq_len / factor) > OVERVIEW:
        factor *= 2
    return factor


__all__ = ["OVERVIEW", "PageData", "build_page_data", "default_budget_mb", "overview_factor"]
