"""HDF5 format 1, the vocabulary: names, layout and masking rules (README, "The HDF5 file (format 1)").

Layout::

    /                  attrs: biasviz_format=1, scheme, context_dependent, source_model, ...
    /input_ids         (sample, query) int32
    /layer_{L}/bias    (sample, head, query, key)   absent when the scheme adds no bias
    /layer_{L}/weights (sample, head, query, key)

Masked cells (key after query) hold NaN in ``bias`` and 0 in ``weights``. NumPy only: the reader,
the writer and the GPU encoder (:mod:`biasviz.store.gpu_encode`, the same rules in torch) share it.
"""

from __future__ import annotations

import datetime as _dt

import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.store import datasets

FORMAT_VERSION = 1
DIMS = ("sample", "head", "query", "key")
FLOAT16_MAX = float(np.finfo(np.float16).max)
REQUIRED_ATTRS = (
    "biasviz_format", "scheme", "context_dependent", "source_model", "model_sha256", "architecture",
    "n_layers", "n_heads", "seq_len", "layers", "samples", "dtype", "device", "seed", "text_source",
    "created_utc", "biasviz_version", "torch_version",
)  # fmt: skip

# What a stored bias means (root attribute ``bias_convention``):
RELATIVE = "relative"  # b_h(i, j) exactly as README's scheme table writes it (e.g. ALiBi: -m_h * (i - j))
KEY_POSITION = "key-position"  # BLOOM-style ALiBi: +m_h * j, equal to -m_h * (i - j) plus a per-row constant
FILL = {"bias": float("nan"), "weights": 0.0}  # what masked cells hold


def layer_group(layer: int) -> str:
    """``layer_group(11) == 'layer_11'``: the group holding one layer's tensors."""
    return f"layer_{layer}"


def causal_cells(seq_len: int) -> np.ndarray:
    """Boolean (query, key) matrix, True where j <= i (the cells a causal model uses)."""
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def chunk_rows(seq_len: int, itemsize: int) -> int:
    """Query rows per chunk: the whole (T, T) matrix, unless that passes HDF5's 4 GiB chunk limit.

    >>> chunk_rows(512, 4), chunk_rows(32768, 4)
    (512, 16384)
    """
    rows = seq_len
    while rows * seq_len * itemsize > 2**31:
        rows = (rows + 1) // 2
    return rows


def non_finite_error(kind: str, layer: int) -> BiasvizError:
    """A captured matrix with NaN or infinity in a used cell: the writer and the GPU encoder both refuse it."""
    return BiasvizError(
        f"the captured {kind} of layer {layer} contains NaN or infinite values; "
        "the model's weights or inputs are broken"
    )


def float16_overflow_error(kind: str, layer: int, peak: float) -> BiasvizError:
    """A matrix whose magnitude float16 storage cannot hold."""
    return BiasvizError(
        f"the {kind} of layer {layer} reaches {peak:.4g}, beyond float16's range ({FLOAT16_MAX:.0f}); "
        "store it with --dtype float32"
    )


# a bias declared the same for every input (bias_shared), measured: the largest |b_a - b_0| over samples and cells
# (0: stored once; above 0: every sample stored). Root attribute of full files and summaries.
BIAS_DIFFERENCE = "bias_max_difference"


# -- summary files (docs/hdf5.md, 'Summary files': ``extract --summary``)
# -------------------------------------------------
DEFAULT_RESOLUTION = 1024  # at most this many query and key blocks per map
# a summary layer's dataset names and dimensions are rows of biasviz.store.datasets' table; these are their old names
SUMMARY_MAPS = datasets.SUMMARY_MAPS  # (head, query_block, key_block)
SUMMARY_MAP_DIMS = datasets.MAP_DIMS
PROFILES = datasets.PROFILES  # (stat, head, distance); 0 = mean, 1 = std
PROFILE_DIMS = datasets.PROFILE_DIMS
PROFILE_STATS = ("mean", "std")
# docs/positional.md (summaries of models whose rows are formed again): the scores' maps and profile as above, and
POSITIONAL_MEAN = datasets.POSITIONAL_MEAN  # (head, query_block, key_block): block means of the positional logits P
POSITIONAL_PROFILE = datasets.POSITIONAL_PROFILE  # (from_key, head, distance): P by distance over keys j >= from_key
POSITIONAL_PROFILE_DIMS = datasets.ROWS[POSITIONAL_PROFILE].dims
POSITIONAL_FROM_KEYS = datasets.POSITIONAL_FROM_KEYS
KEY_PROFILE = datasets.KEY_PROFILE  # (stat, head, key): the weights by key over samples and queries i >= j
KEY_PROFILE_DIMS = datasets.ROWS[KEY_PROFILE].dims
SINK_SHARE = datasets.SINK_SHARE  # (sample, head): per sample, the mean over queries of the weight on key 0
POSITIONAL_DIAGNOSTICS = datasets.POSITIONAL_DIAGNOSTICS  # (head,) compound, as DIAGNOSTICS, of P
# (head or 1, query_block, key_block): the share of each block's cells the call attends to, in a layer whose own mask
# is not the causal triangle (docs/hdf5.md, 'Attended cells'); root attribute MASK says which rule
ATTENDED = datasets.ATTENDED
SE_NOTE = "standard_errors"  # a summary's root attribute where it holds no _se: why (fewer than 3 samples)
LAYER_NOTE = "note"  # a summary layer's attribute: what it leaves out and why (samples masked differently)
LAYER_STATISTICS = "statistics"  # a summary layer's attribute: "fused" (the GPU kernels) or "torch" formed it
# root attribute of a traced model's file: JSON text, the list of the names of the modules that made its attention
# calls, call L (layer L of the file) first; "" for a call of the model's own forward (biasviz.tracing.owners)
CALL_MODULES = "call_modules"
MASK = "mask"  # root attribute: "causal", "bidirectional" or "model" (some layer's own mask, its ATTENDED stored)
DIAGNOSTICS = datasets.DIAGNOSTICS  # (head,) compound dataset
DIAGNOSTIC_FIELDS = datasets.DIAGNOSTIC_FIELDS
BLOCK_SCALES = ("query_block", "key_block")  # root datasets: the first position of each block


def block_size(seq_len: int, resolution: int) -> int:
    """Positions per map block: ceil(T / R), so that a map has at most R x R blocks (1 when R >= T: exact).

    >>> block_size(512, 1024), block_size(16384, 1024), block_size(1000, 300)
    (1, 16, 4)
    """
    return max(1, -(-seq_len // resolution))


def block_starts(seq_len: int, block: int) -> np.ndarray:
    """The first position of each block (the ``query_block`` / ``key_block`` dimension scales).

    >>> block_starts(10, 4).tolist()
    [0, 4, 8]
    """
    return np.arange(0, seq_len, block, dtype=np.int64)
