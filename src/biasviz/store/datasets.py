"""The table of docs/position-measures.md's summary datasets: one row each (name, dimensions, what its values may be,
how checkpoints join), read by the writer, the joiner, the validator, the reader and the xarray view alike, so that a
new measure is its computation plus a row here.

Dimensions are named; :func:`dimension_sizes` gives each its length in a file, so a row's shape is never spelled
twice. ``check`` says what a reader accepts, on every row: ``share`` values in [0, 1] (NaN where nothing was
attended), ``entropy`` in [0, log keys], ``std``, ``se`` and ``norm`` at least 0, ``value`` any finite number or NaN,
``sinks`` the compound (index, share) records with indices inside the keys; a ``stat`` axis's std row at least 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DIRECT_DISTANCES = 16  # distances 0 .. 15 each have a bin of their own
LOG_STEPS = 48  # from 16 on, edges 16 (T / 16)^(k / 48), k = 0 .. 48
SEGMENTS = 10  # context_mass: tenths of the keys a query sees
SINK_RANKS = 8  # sink_keys: the top keys kept per sample and head
SINK_SEEN_PART = 8  # sink_keys rank only keys seen by at least ceil(m / 8) queries, m the most any key is seen by
MIN_SE_SAMPLES = 3  # a standard error needs N >= 3 (docs/position-measures.md)
DISTANCE_BINS = "distance_bins"  # root dataset (distance_bin, 2): first and last distance of each bin
SINK_DTYPE = np.dtype([("index", np.int32), ("share", np.float32)])


@dataclass(frozen=True)
class DatasetRow:
    """One dataset of a summary layer: its name, dimensions (a sweep adds ``checkpoint`` in front), and checks."""

    name: str
    dims: tuple[str, ...]
    check: str  # "share", "entropy", "value", "std", "se", "norm", "sinks": see :func:`bounds`
    doc: str

    @property
    def compound(self) -> bool:
        return self.check == "sinks"


# docs/position-measures.md, the measures over the weights (stat = mean, std over samples)
MEASURES: tuple[DatasetRow, ...] = (
    DatasetRow("band_mass", ("stat", "head", "distance_bin"), "share",
               "weight a query puts on the keys at each distance bin"),
    DatasetRow("context_mass", ("stat", "head", "segment"), "share",
               "weight on each tenth of the keys a query sees"),
    DatasetRow("weights_entropy", ("stat", "head", "query_block"), "entropy",
               "entropy (nats) of each query's weights, block-averaged"),
    DatasetRow("sink_keys", ("sample", "head", "rank"), "sinks",
               "per sample and head, the keys with the highest mean received weight, among the keys seen by at "
               "least sink_min_queries of the sample's queries"),
    DatasetRow("sink_keys_of_mean", ("head", "rank"), "sinks",
               "per head, the keys with the highest received weight averaged over samples, ranked by the same rule"),
    DatasetRow("frequency_use", ("operand", "head", "pair"), "norm",
               "rotary calls: mean 2-norm of each rotary pair of q (0) and k (1), the unrotated dims last"),
    DatasetRow("positional_frequency", ("head", "pair", "distance_bin"), "value",
               "rotary calls: P - mean bias restricted to each rotary pair's dims, over each bin's attended cells"),
)  # fmt: skip
# the standard error beside a mean over samples: its mean row's shape without the stat axis
STANDARD_ERRORS: tuple[DatasetRow, ...] = (
    *(DatasetRow(f"{row.name}_se", row.dims[1:], "se", f"standard error of {row.name}'s mean over samples")
      for row in MEASURES if row.dims[0] == "stat"),
    DatasetRow("weights_key_profile_se", ("head", "key"), "se", "standard error of the key profile's mean"),
    DatasetRow("sink_share_se", ("head",), "se", "standard error of the mean sink share over samples"),
    DatasetRow("frequency_use_se", ("operand", "head", "pair"), "se", "standard error of frequency_use"),
    DatasetRow("positional_frequency_se", ("head", "pair", "distance_bin"), "se",
               "delete-one jackknife standard error of positional_frequency"),
    DatasetRow("positional_mean_se", ("head", "query_block", "key_block"), "se",
               "delete-one jackknife standard error of positional_mean, block by block"),
    DatasetRow("positional_profile_se", ("from_key", "head", "distance"), "se",
               "delete-one jackknife standard error of P's distance profile over all keys and over keys j >= 4"),
    *(DatasetRow(f"{kind}_profile_se", ("head", "distance"), "se", f"standard error of {kind}_profile's mean")
      for kind in ("bias", "weights", "scores")),
    *(DatasetRow(f"{kind}_mean_se", ("head", "query_block", "key_block"), "se",
                 f"standard error of {kind}_mean: over samples of each sample's block mean")
      for kind in ("bias", "weights", "scores")),
)  # fmt: skip
# samples masked differently (docs/hdf5.md, 'Attended cells'): a cell's mean is over the samples that attend it,
# and this is how many
SAMPLES_PER_CELL = "attending_samples"
COUNTS: tuple[DatasetRow, ...] = (
    DatasetRow(SAMPLES_PER_CELL, ("head", "query_block", "key_block"), "norm",
               "samples masked differently: per block, the mean number of samples that attend each of its cells"),
)  # fmt: skip
ROWS: dict[str, DatasetRow] = {row.name: row for row in (*MEASURES, *STANDARD_ERRORS, *COUNTS)}
# attributes a dataset carries, given beside its array under the same keys: how many of frequency_use's rows are
# rotary pairs (one row past them: the unrotated dims together) and the model's layout of them; the pairs of
# positional_frequency summed against P - mean bias (max |difference| / max |P - mean bias|); the queries a key
# must be seen by to rank among the sink keys (one number, or one per sample and head where they differ)
ROW_ATTRS: dict[str, tuple[str, ...]] = {"frequency_use": ("rotary_pairs", "rotary_layout"),
                                         "positional_frequency": ("pair_sum_residual",),
                                         "sink_keys": ("sink_min_queries",)}  # fmt: skip
ROTARY_LAYOUTS = ("half-split", "interleaved")


def distance_bins(seq_len: int) -> np.ndarray:
    """(bins, 2) int64: the first and last distance of each bin (docs/position-measures.md): one per distance 0 .. 15,
    then edges e_k = round(16 (T / 16)^(k / 48)), duplicates removed, bin k = [e_k, e_(k+1) - 1], the last ending
    at T - 1.

    >>> distance_bins(4).tolist()
    [[0, 0], [1, 1], [2, 2], [3, 3]]
    >>> distance_bins(18).tolist()[-3:]
    [[15, 15], [16, 16], [17, 17]]
    """
    direct = [(d, d) for d in range(min(DIRECT_DISTANCES, seq_len))]
    if seq_len <= DIRECT_DISTANCES:
        return np.asarray(direct, dtype=np.int64).reshape(-1, 2)
    k = np.arange(LOG_STEPS + 1)
    edges = np.floor(DIRECT_DISTANCES * (seq_len / DIRECT_DISTANCES) ** (k / LOG_STEPS) + 0.5).astype(np.int64)
    edges = np.unique(np.clip(edges, DIRECT_DISTANCES, seq_len))
    edges[-1] = seq_len
    spans = [(int(a), int(b) - 1) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return np.asarray(direct + spans, dtype=np.int64)


def dimension_sizes(*, heads: int, seq_len: int, samples: int, blocks: int, pairs: int = 0,
                    causal: bool = True) -> dict[str, int]:  # fmt: skip
    """The length of every named dimension in a file of these sizes (``pairs``: the rotary pairs a layer's
    ``frequency_use`` holds, its own: the model's layout decides it; a bidirectional file's profiles run over
    2T - 1 signed distances)."""
    return {"distance": seq_len if causal else 2 * seq_len - 1, "stat": 2, "operand": 2, "head": heads,
            "distance_bin": len(distance_bins(seq_len)), "segment": SEGMENTS,
            "query_block": blocks, "key_block": blocks, "sample": samples, "rank": SINK_RANKS, "key": seq_len,
            "pair": pairs, "from_key": 2}  # fmt: skip


def shape_of(row: DatasetRow, sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(sizes[d] for d in row.dims)


def _range(lo: float, hi: float) -> Callable[[np.ndarray], bool]:
    """Values in [lo, hi] (a little slack for float32 sums); NaN passes (nothing attended there)."""
    slack = 1e-5 * max(1.0, abs(hi)) if math.isfinite(hi) else 0.0
    return lambda v: not ((v < lo - 1e-6).any() or (v > hi + slack).any())


def bounds(check: str, keys: int) -> tuple[float, float]:
    """What a value of kind ``check`` may be in a file whose queries see up to ``keys`` keys: shares in [0, 1],
    entropies in [0, log keys], spreads (std, se, norm) at least 0, plain values anything finite."""
    return {"share": (0.0, 1.0), "entropy": (0.0, math.log(max(keys, 1)) * (1 + 1e-4)), "std": (0.0, math.inf),
            "se": (0.0, math.inf), "norm": (0.0, math.inf)}.get(check, (-math.inf, math.inf))  # fmt: skip


_WORDS = {"share": "shares outside [0, 1]", "entropy": "entropies outside [0, log keys]", "norm": "negative norms",
          "std": "negative standard deviations", "se": "negative standard errors"}  # fmt: skip


def values_fault(row: DatasetRow, values: np.ndarray, *, keys: int) -> str | None:
    """What is wrong with ``values`` for ``row`` in a file of ``keys`` positions (None: nothing): every row of the
    dataset checked, as the table says. A ``stat`` axis holds the mean (checked as the row's kind) and the std over
    samples (at least 0, and no wider than the mean's range)."""
    if row.compound:
        if values.dtype.names is None or set(values.dtype.names) != set(SINK_DTYPE.names or ()):
            return "is not (index, share) records"
        share, index = values["share"].astype(np.float64), values["index"]
        if (index < -1).any() or (index >= keys).any():  # -1: fewer keys than ranks
            return f"holds key indices outside 0..{keys - 1}"
        kept = index >= 0
        if np.isinf(share).any() or not _range(0.0, 1.0)(share[kept]):
            return "holds shares outside [0, 1]"
        return None
    v = np.asarray(values, dtype=np.float64)
    if np.isinf(v).any():
        return "holds infinite values"
    lo, hi = bounds(row.check, keys)
    mean, spread = (v[0], v[1]) if row.dims[0] == "stat" else (v, None)
    if not _range(lo, hi)(mean):
        return f"holds {_WORDS.get(row.check, 'values out of range')}"
    if spread is not None and not _range(0.0, hi - lo)(spread):
        return f"holds {_WORDS['std']}" if (spread < 0).any() else "holds standard deviations wider than its range"
    return None
