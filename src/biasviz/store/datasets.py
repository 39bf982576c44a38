"""The table of a summary layer's datasets (docs/hdf5.md, 'Summary files'; docs/positional.md;
docs/position-measures.md): one row each (name, dimensions, what its values may be), read by the writer, the joiner,
the validator, the reader, the xarray view and ``biasviz info`` alike, so that a dataset's name, shape and checks are
spelled once and a new measure is its computation plus a row here.

Dimensions are named; :func:`dimension_sizes` gives each its length in a file, so a row's shape is never spelled
twice. ``check`` says what a reader accepts, on every row: ``share`` values in [0, 1] (NaN where nothing was
attended), ``entropy`` in [0, log keys], ``std``, ``se`` and ``norm`` at least 0, ``value`` any finite number or NaN,
``sinks`` the compound (index, share) records with indices inside the keys, ``diagnostics`` the compound records of
:data:`DIAGNOSTIC_FIELDS` (at least 0, NaN where undefined); a ``stat`` axis's std row at least 0.
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


# the compound (head,) records of a layer's diagnostics, computed at extraction at full resolution
DIAGNOSTIC_FIELDS = ("context_dependence", "toeplitz_residual", "separability_residual")
DIAGNOSTIC_DTYPE = np.dtype([(name, np.float64) for name in DIAGNOSTIC_FIELDS])


@dataclass(frozen=True)
class DatasetRow:
    """One dataset of a summary layer: its name, dimensions (a sweep adds ``checkpoint`` in front), and checks.
    ``broadcast``: dimensions a file may hold once for all (length 1), as docs/hdf5.md allows ``attended``.
    ``reducer``: ``"module:Class"``, the :class:`~biasviz.summaries.reducers.Reducer` that computes the row from the
    layer's row blocks, where one does (the others are computed by the summary's own passes).
    ``filled``: the index of the values that hold a number in every layer without a mask of its own (a causal or
    bidirectional rule attends a cell at every distance and key), ``()`` all of them; None: NaN wherever nothing was
    attended. A reader refuses NaN there, and infinities anywhere."""

    name: str
    dims: tuple[str, ...]
    check: str  # "share", "entropy", "value", "std", "se", "norm", "sinks", "diagnostics": see :func:`bounds`
    doc: str
    broadcast: tuple[str, ...] = ()
    reducer: str = ""
    filled: tuple[int, ...] | None = None

    @property
    def compound(self) -> bool:
        return self.check in ("sinks", "diagnostics")

    @property
    def dtype(self) -> np.dtype:
        """What the writer stores: float32, or the row's compound records."""
        return {"sinks": SINK_DTYPE, "diagnostics": DIAGNOSTIC_DTYPE}.get(self.check, np.dtype(np.float32))


# docs/hdf5.md, 'Summary files': per quantity a summary reduces, block-mean maps over samples (mean, std) and the
# distance profile (stat = mean, std)
KINDS = ("bias", "weights", "scores")
MAP_DIMS = ("head", "query_block", "key_block")
PROFILE_DIMS = ("stat", "head", "distance")
_KIND_CHECKS = {"bias": "value", "weights": "share", "scores": "value"}


def map_name(kind: str, stat: str = "mean") -> str:
    """``map_name("bias", "std") == "bias_std"``: a quantity's block map over samples."""
    return f"{kind}_{stat}"


def profile_name(kind: str) -> str:
    """``profile_name("weights") == "weights_profile"``: a quantity's distance profile."""
    return f"{kind}_profile"


KIND_MAPS: tuple[DatasetRow, ...] = tuple(
    DatasetRow(map_name(kind, stat), MAP_DIMS, _KIND_CHECKS[kind] if stat == "mean" else "std",
               f"block {stat} over samples of the {kind}")
    for kind in KINDS for stat in ("mean", "std"))  # fmt: skip
# docs/positional.md (summaries of models whose rows are formed again): the positional logits P, the weights by key
POSITIONAL_MEAN = "positional_mean"
POSITIONAL_PROFILE = "positional_profile"
POSITIONAL_DIAGNOSTICS = "positional_diagnostics"
POSITIONAL_FROM_KEYS = (0, 4)  # over all keys, and past the first four (sinks, a BOS shared by every window)
KEY_PROFILE = "weights_key_profile"
SINK_SHARE = "sink_share"
DIAGNOSTICS = "diagnostics"
# the share of each block's cells the call attends to, in a layer whose own mask is not the causal triangle (a sliding
# window, a block mask: docs/hdf5.md, 'Attended cells')
ATTENDED = "attended"
LAYER_ROWS: tuple[DatasetRow, ...] = (
    *KIND_MAPS,
    DatasetRow(POSITIONAL_MEAN, MAP_DIMS, "value", "block means of the positional logits P"),
    *(DatasetRow(profile_name(kind), PROFILE_DIMS, _KIND_CHECKS[kind],
                 f"the {kind} by distance: mean and std over samples and the queries at each distance", filled=())
      for kind in KINDS),
    DatasetRow(DIAGNOSTICS, ("head",), "diagnostics", "the bias's diagnostics, computed at full resolution"),
    DatasetRow(POSITIONAL_PROFILE, ("from_key", "head", "distance"), "value",
               "P by distance over keys j >= from_key (POSITIONAL_FROM_KEYS)", filled=(0,)),
    DatasetRow(KEY_PROFILE, ("stat", "head", "key"), "share",
               "the weights by key over samples and the queries that see it",
               reducer="biasviz.summaries.key_profile:KeyProfile", filled=()),
    DatasetRow(SINK_SHARE, ("sample", "head"), "share", "per sample, the mean over queries of the weight on key 0",
               reducer="biasviz.summaries.sink_share:SinkShare", filled=()),
    DatasetRow(POSITIONAL_DIAGNOSTICS, ("head",), "diagnostics", "the diagnostics of the positional logits P"),
    DatasetRow(ATTENDED, MAP_DIMS, "share", "the share of each block's cells the layer's own mask attends",
               broadcast=("head",)),
)  # fmt: skip
SUMMARY_MAPS = (*(row.name for row in KIND_MAPS), POSITIONAL_MEAN)  # what the reader's read_map reads
PROFILES = tuple(profile_name(kind) for kind in KINDS)
# docs/position-measures.md, the measures over the weights (stat = mean, std over samples) and over the rotary calls
BAND_MASS = "band_mass"
CONTEXT_MASS = "context_mass"
WEIGHTS_ENTROPY = "weights_entropy"
ATTENTION_DISTANCE = "attention_distance"
SINK_KEYS = "sink_keys"
SINK_KEYS_OF_MEAN = "sink_keys_of_mean"
FREQUENCY_USE = "frequency_use"
POSITIONAL_FREQUENCY = "positional_frequency"
WEIGHT_MEASURES = "biasviz.summaries.weight_measures:WeightMeasures"  # one reducer gives five rows
MEASURES: tuple[DatasetRow, ...] = (
    DatasetRow(BAND_MASS, ("stat", "head", "distance_bin"), "share",
               "weight a query puts on the keys at each distance bin", reducer=WEIGHT_MEASURES),
    DatasetRow(CONTEXT_MASS, ("stat", "head", "segment"), "share",
               "weight on each tenth of the keys a query sees", reducer=WEIGHT_MEASURES),
    DatasetRow(WEIGHTS_ENTROPY, ("stat", "head", "query_block"), "entropy",
               "entropy (nats) of each query's weights, block-averaged", reducer=WEIGHT_MEASURES),
    DatasetRow(ATTENTION_DISTANCE, ("stat", "head"), "norm",
               "mean over the queries of Σ_j w(i, j)·|i - j|: how far a head looks",
               reducer="biasviz.summaries.attention_distance:AttentionDistance"),
    DatasetRow(SINK_KEYS, ("sample", "head", "rank"), "sinks",
               "per sample and head, the keys with the highest mean received weight, among the keys seen by at "
               "least sink_min_queries of the sample's queries", reducer=WEIGHT_MEASURES),
    DatasetRow(SINK_KEYS_OF_MEAN, ("head", "rank"), "sinks",
               "per head, the keys with the highest received weight averaged over samples, ranked by the same rule",
               reducer=WEIGHT_MEASURES),
    DatasetRow(FREQUENCY_USE, ("operand", "head", "pair"), "norm",
               "rotary calls: mean 2-norm of each rotary pair of q (0) and k (1), the unrotated dims last"),
    DatasetRow(POSITIONAL_FREQUENCY, ("head", "pair", "distance_bin"), "value",
               "rotary calls: P - mean bias restricted to each rotary pair's dims, over each bin's attended cells"),
)  # fmt: skip


def se_name(name: str) -> str:
    """``se_name("sink_share") == "sink_share_se"``: the standard error beside a mean over samples."""
    return f"{name}_se"


# the standard error beside a mean over samples: its mean row's shape without the stat axis
STANDARD_ERRORS: tuple[DatasetRow, ...] = (
    *(DatasetRow(se_name(row.name), row.dims[1:], "se", f"standard error of {row.name}'s mean over samples")
      for row in MEASURES if row.dims[0] == "stat"),
    DatasetRow(se_name(KEY_PROFILE), ("head", "key"), "se", "standard error of the key profile's mean"),
    DatasetRow(se_name(SINK_SHARE), ("head",), "se", "standard error of the mean sink share over samples"),
    DatasetRow(se_name(FREQUENCY_USE), ("operand", "head", "pair"), "se", f"standard error of {FREQUENCY_USE}"),
    DatasetRow(se_name(POSITIONAL_FREQUENCY), ("head", "pair", "distance_bin"), "se",
               f"delete-one jackknife standard error of {POSITIONAL_FREQUENCY}"),
    DatasetRow(se_name(POSITIONAL_MEAN), MAP_DIMS, "se",
               f"delete-one jackknife standard error of {POSITIONAL_MEAN}, block by block"),
    DatasetRow(se_name(POSITIONAL_PROFILE), ("from_key", "head", "distance"), "se",
               "delete-one jackknife standard error of P's distance profile over all keys and over keys j >= 4"),
    *(DatasetRow(se_name(profile_name(kind)), ("head", "distance"), "se",
                 f"standard error of {profile_name(kind)}'s mean") for kind in KINDS),
    *(DatasetRow(se_name(map_name(kind)), MAP_DIMS, "se",
                 f"standard error of {map_name(kind)}: over samples of each sample's block mean") for kind in KINDS),
)  # fmt: skip
# samples masked differently (docs/hdf5.md, 'Attended cells'): a cell's mean is over the samples that attend it,
# and this is how many
SAMPLES_PER_CELL = "attending_samples"
COUNTS: tuple[DatasetRow, ...] = (
    DatasetRow(SAMPLES_PER_CELL, ("head", "query_block", "key_block"), "norm",
               "samples masked differently: per block, the mean number of samples that attend each of its cells"),
)  # fmt: skip
# the rows a layer's measures fill (docs/position-measures.md), and every row of a summary layer, in the order the
# validator lists what a layer holds
MEASURE_ROWS: dict[str, DatasetRow] = {row.name: row for row in (*MEASURES, *STANDARD_ERRORS, *COUNTS)}
ROWS: dict[str, DatasetRow] = {row.name: row for row in LAYER_ROWS} | MEASURE_ROWS


def reduced_rows() -> tuple[str, ...]:
    """docs/positional.md's rows that a reducer gives (the key profile, the sink share), written with every summary: the
    table's rows with a reducer outside docs/position-measures.md's, in its order."""
    return tuple(name for name, row in ROWS.items() if row.reducer and name not in MEASURE_ROWS)


# attributes a dataset carries, given beside its array under the same keys: how many of frequency_use's rows are
# rotary pairs (one row past them: the unrotated dims together) and the model's layout of them; the pairs of
# positional_frequency summed against P - mean bias (max |difference| / max |P - mean bias|); the queries a key
# must be seen by to rank among the sink keys (one number, or one per sample and head where they differ)
ROW_ATTRS: dict[str, tuple[str, ...]] = {FREQUENCY_USE: ("rotary_pairs", "rotary_layout"),
                                         POSITIONAL_FREQUENCY: ("pair_sum_residual",),
                                         SINK_KEYS: ("sink_min_queries",)}  # fmt: skip
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
    if row.check == "diagnostics":
        if values.dtype.names is None or any(name not in values.dtype.names for name in DIAGNOSTIC_FIELDS):
            return f"is not records of {', '.join(DIAGNOSTIC_FIELDS)}"
        for name in DIAGNOSTIC_FIELDS:
            v = np.asarray(values[name], dtype=np.float64)
            if np.isinf(v).any() or (v < 0).any():
                return f"holds a negative or infinite {name}"
        return None
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


def dtype_fits(row: DatasetRow, dtype: np.dtype) -> bool:
    """Whether a stored dataset's type is what ``row`` holds: floats, or records with the row's float fields."""
    if row.check == "diagnostics":
        fields = dtype.fields or {}
        return all(name in fields and fields[name][0].kind == "f" for name in DIAGNOSTIC_FIELDS)
    return dtype.names is not None if row.compound else dtype.kind == "f"


def expected_text(row: DatasetRow, shape: tuple[int, ...]) -> str:
    """What a file should hold for ``row`` at ``shape``, in the words of a validation error."""
    dims = ", ".join(f"{d} or 1" if d in row.broadcast else d for d in row.dims)
    if row.check == "diagnostics":
        return f"{shape} records with float fields {', '.join(DIAGNOSTIC_FIELDS)} ({dims})"
    if row.compound:
        return f"{shape} (index, share) records ({dims})"
    return f"float {shape} ({dims})"
