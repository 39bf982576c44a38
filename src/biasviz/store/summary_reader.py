"""Summary files (docs/hdf5.md, 'Summary files', ``extract --summary``): their validation, and reading their datasets.

A summary holds, per layer, block-mean maps over samples (``bias_mean``, ``bias_std``, ``weights_mean``,
``weights_std``: (head, query_block, key_block)), distance profiles ((stat, head, distance)) and the
diagnostics computed at extraction ((head,) compound). Blocks are ``block`` positions wide; the dimension
scales ``/query_block`` and ``/key_block`` hold each block's first position. With ``--checkpoints``
every layer dataset has a leading checkpoint dimension. Everything is checked on opening against the
file's own head count, length and resolution, so that readers never meet a shape they do not expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import h5py
import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.common.terminal import inert
from biasviz.store import datasets
from biasviz.store.datasets import (
    ATTENDED,
    DIAGNOSTIC_FIELDS,
    DIAGNOSTICS,
    FREQUENCY_USE,
    PROFILES,
    SINK_KEYS,
    SUMMARY_MAPS,
    profile_name,
)
from biasviz.store.format import (
    BLOCK_SCALES,
    LAYER_NOTE,
    LAYER_STATISTICS,
    PROFILE_STATS,
    block_size,
    block_starts,
    layer_group,
)
from biasviz.store.validation import AttrChecks, shape_text

# what a quantity's summary is: all of them, or none
KIND_DATASETS = {kind: (datasets.map_name(kind, "mean"), datasets.map_name(kind, "std"), datasets.profile_name(kind))
                 for kind in datasets.KINDS}  # fmt: skip


def causal_block_counts(seq_len: int, block: int, causal: bool = True) -> np.ndarray:
    """Cells j <= i in each (query block, key block) of a ``seq_len`` matrix cut into ``block``-wide blocks.

    A block mean is the mean over these cells (0: the block lies above the diagonal, its mean is NaN).
    Closed form per block, so it costs (T / block)^2, not T^2. Without ``causal`` every cell counts.

    >>> causal_block_counts(5, 2).tolist()
    [[3, 0, 0], [4, 3, 0], [2, 2, 1]]
    """
    starts = block_starts(seq_len, block)
    widths = np.minimum(block, seq_len - starts)
    if not causal:
        return np.outer(widths, widths).astype(np.int64)
    q0, q1 = starts[:, None], (starts + widths)[:, None]
    k0, w = starts[None, :], widths[None, :]

    def upto(n: np.ndarray) -> np.ndarray:  # sum over a <= n of min(max(a, 0), w), for n >= -1
        n = np.maximum(n, 0)
        inside = np.minimum(n, w)
        return inside * (inside + 1) // 2 + np.maximum(n - w, 0) * w

    # row i of the query block holds min(max(i + 1 - k0, 0), w) cells of the key block
    return (upto(q1 - k0) - upto(q0 - k0)).astype(np.int64)


@dataclass
class SummaryLayout:
    """What a valid summary file holds, and how to read it (one checkpoint at a time in a sweep)."""

    path: str
    h5: h5py.File
    seq_len: int
    n_heads: int
    n_samples: int
    causal: bool
    resolution: int
    block: int
    lead: tuple[int, ...]  # (checkpoints,) in a sweep, else ()
    contents: dict[int, tuple[str, ...]] = field(default_factory=dict)  # layer -> dataset names it holds
    profile_start: int = 0  # the distance of a profile's first entry (-(T - 1) for bidirectional profiles)

    @property
    def n_blocks(self) -> int:
        return len(block_starts(self.seq_len, self.block))

    @cached_property
    def counts(self) -> np.ndarray:
        """(query block, key block) number of cells each block mean averages."""
        return causal_block_counts(self.seq_len, self.block, self.causal)

    def holds(self, layer: int, name: str) -> bool:
        return name in self.contents.get(layer, ())

    def note(self, layer: int) -> str | None:
        """What the layer's summary leaves out and why (its ``note`` attribute: samples masked differently), as
        plain printable text of at most 400 characters (data from a file: shown, never trusted); None without."""
        value = self.h5[layer_group(layer)].attrs.get(LAYER_NOTE) if layer_group(layer) in self.h5 else None
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str) or not value:
            return None
        text = inert(value[:400])  # data from the file, shown as data
        return text + ("..." if len(value) > 400 else "")

    def statistics(self, layer: int) -> str | None:
        """Which implementation formed the layer's statistics (its attribute ``statistics``): ``fused`` (the GPU
        kernels), ``torch``, or both, comma-separated, for a sweep whose checkpoints differ; None where the file does
        not say (written before the attribute existed) or says something else (data from a file: never trusted)."""
        value = self.h5[layer_group(layer)].attrs.get(LAYER_STATISTICS) if layer_group(layer) in self.h5 else None
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str) or not value or not set(value.split(", ")) <= {"fused", "torch"}:
            return None
        return value

    def used(self, layer: int, checkpoint: int = 0) -> np.ndarray:
        """(query block, key block), or (head, ...) for a layer with its own mask: the blocks with attended cells."""
        if not self.holds(layer, ATTENDED):
            return self.counts > 0
        share = self._read(layer, ATTENDED, checkpoint).astype(np.float64)
        if not np.isfinite(share).all() or (share < 0).any() or (share > 1).any():
            raise self._damaged(f"{ATTENDED} of layer {layer} holds values outside [0, 1]")
        return (self.counts > 0) & (share > 0)

    def _finite(self, layer: int, values: np.ndarray) -> bool:
        """No infinite value; NaN only in a layer with its own mask (a distance or key no query attends to)."""
        if np.isinf(values).any():
            return False
        return self.holds(layer, ATTENDED) or bool(np.isfinite(values).all())

    def _read(self, layer: int, name: str, checkpoint: int) -> np.ndarray:
        if not self.holds(layer, name):
            raise BiasvizError(f"{self.path} holds no {name} in layer {layer}: {self._why_absent(name)}")
        ds = self.h5[f"{layer_group(layer)}/{name}"]
        return np.asarray(ds[checkpoint] if self.lead else ds[()])

    def _why_absent(self, name: str) -> str:
        if name.startswith("weights"):
            return "it holds the bias only (extracted with --bias-only, no forward pass)"
        return "the scheme adds no bias" if name.startswith("bias") else "it was not stored"

    def _damaged(self, what: str) -> BiasvizError:
        return BiasvizError(f"{self.path}: {what}; the file is damaged or was not written by 'biasviz extract'; "
                            "extract it again")  # fmt: skip

    def read_map(self, name: str, layer: int, checkpoint: int = 0) -> np.ndarray:
        """One of :data:`SUMMARY_MAPS` as float32 (head, query_block, key_block); blocks with no cell are NaN."""
        if name not in SUMMARY_MAPS:
            raise ValueError(f"name must be one of {SUMMARY_MAPS}, not {name!r}")
        m = self._read(layer, name, checkpoint).astype(np.float32)
        used = np.broadcast_to(self.used(layer, checkpoint), m.shape)
        if not np.isfinite(m[used]).all():
            raise self._damaged(f"{name} of layer {layer} holds NaN or infinite values in blocks with cells")
        m[~used] = np.nan
        return self._checked(layer, name, m)

    def read_profile(self, kind: str, layer: int, checkpoint: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``kind``'s distance profile: (mean, std), each float64 (head, distance) from ``profile_start``."""
        p = self.read_row(profile_name(kind), layer, checkpoint)
        return p[PROFILE_STATS.index("mean")], p[PROFILE_STATS.index("std")]

    def read_row(self, name: str, layer: int, checkpoint: int = 0) -> np.ndarray:
        """A dataset of the table of datasets (:data:`biasviz.store.datasets.ROWS`), checked as its row says: float64,
        or its compound records (``sink_keys``; the diagnostics' with float64 fields); NaN only where nothing was
        attended, and where the row is :attr:`~biasviz.store.datasets.DatasetRow.filled`, only in a layer with a mask
        of its own."""
        row = datasets.ROWS.get(name)
        if row is None:
            raise ValueError(f"name must be one of {tuple(datasets.ROWS)}, not {name!r}")
        values = self._read(layer, name, checkpoint)
        if not row.compound:
            values = values.astype(np.float64)
            if row.filled is not None and not self._finite(layer, values[row.filled]):
                raise self._damaged(f"{name} of layer {layer} holds NaN or infinite values")
        values = self._checked(layer, name, values)
        if row.check == "diagnostics":  # float64 fields, whatever floats the file stored
            out = np.zeros(values.shape, dtype=datasets.DIAGNOSTIC_DTYPE)
            for field_name in DIAGNOSTIC_FIELDS:
                out[field_name] = values[field_name]
            return out
        return values

    def _checked(self, layer: int, name: str, values: np.ndarray) -> np.ndarray:
        """``values`` of ``name``, refused where its row of the table of datasets says they cannot be."""
        fault = datasets.values_fault(datasets.ROWS[name], values, keys=self.seq_len)
        if fault is not None:
            raise self._damaged(f"{name} of layer {layer} {fault}")
        return values

    def rotary_pairs(self, layer: int) -> tuple[int, str] | None:
        """How many of ``frequency_use``'s rows are rotary pairs (one more row: the unrotated dims) and their layout
        ('half-split', 'interleaved'); None where the file does not say (made before it recorded them)."""
        attrs = self.h5[f"{layer_group(layer)}/{FREQUENCY_USE}"].attrs
        pairs, layout = attrs.get("rotary_pairs"), attrs.get("rotary_layout")
        if pairs is None or layout is None:
            return None
        rows = self.h5[f"{layer_group(layer)}/{FREQUENCY_USE}"].shape[-1]
        layout = layout.decode("utf-8", "replace") if isinstance(layout, bytes) else layout
        if (not isinstance(pairs, int | np.integer) or not 1 <= int(pairs) <= rows or rows - int(pairs) > 1
                or layout not in datasets.ROTARY_LAYOUTS):  # fmt: skip
            raise self._damaged(f"{FREQUENCY_USE} of layer {layer} says it holds {pairs!r} rotary pairs "
                                f"({layout!r}) in {rows} rows")  # fmt: skip
        return int(pairs), str(layout)

    def sink_min_queries(self, layer: int) -> np.ndarray | None:
        """The queries a key must be seen by to rank among ``sink_keys``: int64 (sample, head); None where the file
        does not say (made before the rule, its keys ranked over every key)."""
        said = self.h5[f"{layer_group(layer)}/{SINK_KEYS}"].attrs.get("sink_min_queries")
        if said is None:
            return None
        value = np.asarray(said)
        shape = (self.n_samples, self.n_heads)
        if value.dtype.kind not in "iu" or value.ndim not in (0, 2) or (value.ndim and value.shape != shape) \
                or (value < 1).any() or (value > self.seq_len).any():
            raise self._damaged(f"{SINK_KEYS} of layer {layer} says keys rank from {value.tolist()!r} queries on")
        return np.broadcast_to(value.astype(np.int64), shape)

    def distance_bins(self) -> np.ndarray:
        """(bin, 2) int64: the first and last distance of each bin of docs/position-measures.md."""
        return datasets.distance_bins(self.seq_len)

    def read_diagnostics(self, layer: int, checkpoint: int = 0, name: str = DIAGNOSTICS) -> dict[str, np.ndarray]:
        """The diagnostics computed at extraction (of the bias, or ``positional_diagnostics`` of P): field ->
        float64 (head,), NaN where undefined."""
        row = datasets.ROWS.get(name)
        if row is None or row.check != "diagnostics":
            raise ValueError(f"name must be one of {[n for n, r in datasets.ROWS.items() if r.check == 'diagnostics']}"
                             f", not {name!r}")  # fmt: skip
        rec = self.read_row(name, layer, checkpoint)
        return {f: np.asarray(rec[f], dtype=np.float64) for f in DIAGNOSTIC_FIELDS}


def validate_summary(checks: AttrChecks, *, seq_len: int, n_heads: int, n_samples: int, layers: list[int],
                     lead: tuple[int, ...], bias_only: bool, causal: bool) -> SummaryLayout:  # fmt: skip
    """Check a summary file against its own attributes; one :class:`BiasvizError` naming the first fault."""
    resolution = checks._int_attr("resolution", minimum=1)
    block = checks._int_attr("block", minimum=1)
    if block != block_size(seq_len, resolution):
        raise checks._bad(f"attribute 'block' is {block}, but {seq_len} positions at resolution {resolution} make "
                          f"blocks of ceil({seq_len} / {resolution}) = {block_size(seq_len, resolution)}")  # fmt: skip
    stated = checks._int_attr("samples", minimum=0)
    if stated != n_samples:
        raise checks._bad(f"attribute 'samples' is {stated}, but 'input_ids' holds {n_samples} samples")
    if bias_only and n_samples:
        raise checks._bad(f"a --bias-only summary reduces no samples, but 'input_ids' holds {n_samples}")
    starts = block_starts(seq_len, block)
    for name in BLOCK_SCALES:
        ds = checks._dataset(name)
        if ds is None or ds.ndim != 1 or ds.dtype.kind not in "iu" or ds.shape != starts.shape:
            what = "absent" if ds is None else shape_text(ds)
            raise checks._bad(f"'{name}' is {what}, expected the {len(starts)} first positions of the blocks")
        if not np.array_equal(ds[()], starts):
            raise checks._bad(f"'{name}' does not hold the first positions of blocks of {block} ({starts[:3]}...)")
    layout = SummaryLayout(path=str(checks.path), h5=checks._h5, seq_len=seq_len, n_heads=n_heads, causal=causal,
                           n_samples=n_samples, resolution=resolution, block=block, lead=lead)  # fmt: skip
    for layer in layers:
        layout.contents[layer] = _check_layer(checks, layout, layer, bias_only)
    return layout


def _check_layer(checks: AttrChecks, layout: SummaryLayout, layer: int, bias_only: bool) -> tuple[str, ...]:
    """The rows of the table of datasets a layer holds, in the table's order, each of its row's shape and type."""
    group = layer_group(layer)
    checks._refuse_other_files(group)
    if not isinstance(checks._h5.get(group), h5py.Group):
        raise BiasvizError(f"{checks.path} lists layer {layer} but has no group {group}")
    held = tuple(n for n in datasets.ROWS if checks._dataset(f"{group}/{n}") is not None)
    for kind, wanted in KIND_DATASETS.items():
        present = [n for n in wanted if n in held]
        required = kind == "bias" if bias_only else kind == "weights"
        if (present or required) and len(present) != len(wanted):
            missing = ", ".join(f"{group}/{n}" for n in wanted if n not in held)
            raise checks._bad(f"it is a summary file but lacks {missing}")
    errors = [n for n in held if datasets.ROWS[n].check == "se"]
    if errors and layout.n_samples < datasets.MIN_SE_SAMPLES:  # docs/position-measures.md: N < 3 has none
        raise checks._bad(f"{group}/{errors[0]} is a standard error over {layout.n_samples} samples; a summary holds "
                          f"standard errors from {datasets.MIN_SE_SAMPLES} samples on")  # fmt: skip
    if bias_only and any(n.startswith("weights") for n in held):
        raise checks._bad(f"a --bias-only summary holds attention weights ({group})")
    if datasets.map_name("bias") in held and DIAGNOSTICS not in held:
        raise checks._bad(f"it is a summary file but lacks {group}/{DIAGNOSTICS}")
    t, lead = layout.seq_len, layout.lead
    sizes = datasets.dimension_sizes(heads=layout.n_heads, seq_len=t, samples=layout.n_samples,
                                     blocks=layout.n_blocks, causal=layout.causal)  # fmt: skip
    for name in held:
        ds, row = checks._h5[f"{group}/{name}"], datasets.ROWS[name]
        shape = (*lead, *datasets.shape_of(row, _stored_sizes(row, sizes, ds.shape[len(lead):], layout)))
        if ds.shape != shape or not datasets.dtype_fits(row, ds.dtype):
            raise checks._bad(f"{group}/{name} is {shape_text(ds)}, expected {datasets.expected_text(row, shape)}")
        if name in PROFILES and shape[-1] == 2 * t - 1 and t > 1:  # a bidirectional profile: signed distances
            layout.profile_start = -(t - 1)
    return held


def _stored_sizes(row: datasets.DatasetRow, sizes: dict[str, int], stored: tuple[int, ...],
                  layout: SummaryLayout) -> dict[str, int]:  # fmt: skip
    """``sizes`` where a file may choose a dimension's length itself: the model's own number of rotary pairs, a
    causal call's T distances in a file that sees every key (an encoder-decoder's decoder), one ``attended`` share
    for all heads (docs/hdf5.md, 'Attended cells')."""
    if len(stored) != len(row.dims):
        return sizes
    t, own = layout.seq_len, dict(sizes)
    lengths = (t,) if layout.causal else (t, 2 * t - 1)
    for axis, dim in enumerate(row.dims):
        if dim == "pair":
            own["pair"] = max(1, stored[axis])
        elif dim == "distance" and stored[axis] in lengths:
            own["distance"] = stored[axis]
        elif dim in row.broadcast and stored[axis] == 1:
            own[dim] = 1
    return own


__all__ = ["KIND_DATASETS", "SummaryLayout", "causal_block_counts", "validate_summary"]
