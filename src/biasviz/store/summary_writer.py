"""Writing summary files (docs/hdf5.md, 'Summary files'): small, written once at the end, moved into place only when
complete.

A summary's size does not depend on the number of samples: per layer four (head, query block, key block)
maps, two (stat, head, distance) profiles and the (head,) diagnostics, whatever N is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np

from biasviz.common.atomic import replacing
from biasviz.common.errors import BiasvizError, os_error_message
from biasviz.common.exclusive import writing_alone
from biasviz.store import datasets
from biasviz.store.datasets import (
    ATTENDED,
    DIAGNOSTICS,
    KEY_PROFILE,
    KINDS,
    POSITIONAL_DIAGNOSTICS,
    POSITIONAL_FROM_KEYS,
    POSITIONAL_MEAN,
    POSITIONAL_PROFILE,
    map_name,
    profile_name,
)
from biasviz.store.deflate import compression_threads, encode_chunk
from biasviz.store.format import FORMAT_VERSION, LAYER_NOTE, LAYER_STATISTICS, block_starts, layer_group, utc_now
from biasviz.store.h5io import attr_value

SUMMARY_DEFLATE_LEVEL = 1  # the level summary files have always used


class LayerSummary(Protocol):
    """What is stored of one quantity of one layer (:class:`biasviz.summaries.Summary`)."""

    mean: np.ndarray
    std: np.ndarray
    profile: np.ndarray
    diagnostics: np.ndarray | None


# one checkpoint's summaries: {layer: {"bias": ..., "weights": ...}}
Summaries = Mapping[int, Mapping[str, LayerSummary]]


def write_summary_file(
    path: str | Path, *, attrs: Mapping[str, Any], input_ids: np.ndarray, n_heads: int, seq_len: int,
    resolution: int, block: int, layers: Sequence[int], summaries: Sequence[Summaries],
    checkpoints: Sequence[int] | None = None, causal: bool = True, force: bool = False,
) -> Path:  # fmt: skip
    """Write ``summaries`` (one per checkpoint, or one) to ``path`` atomically; an existing file needs ``force``."""
    path = Path(path)
    if checkpoints is not None and len(checkpoints) != len(summaries):
        raise ValueError("one summary per checkpoint")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with writing_alone(path), replacing(path, overwrite=force) as tmp, h5py.File(tmp, "w") as f:
            _root(f, attrs, input_ids, n_heads, seq_len, resolution, block, layers, checkpoints, causal)
            for layer in layers:
                grp = f.create_group(layer_group(layer))
                kinds = [k for k in KINDS if k in summaries[0][layer]]
                for kind in kinds:
                    parts = [s[layer][kind] for s in summaries]
                    _write(f, grp, map_name(kind, "mean"), [p.mean for p in parts], checkpoints)
                    _write(f, grp, map_name(kind, "std"), [p.std for p in parts], checkpoints)
                    _write(f, grp, profile_name(kind), [p.profile for p in parts], checkpoints)
                if "bias" in kinds:
                    _write(f, grp, DIAGNOSTICS, [s[layer]["bias"].diagnostics for s in summaries], checkpoints)
                if "position" in summaries[0][layer]:
                    _write_position(f, grp, [s[layer]["position"] for s in summaries], checkpoints)
    except OSError as exc:
        raise BiasvizError(os_error_message(exc, path)) from exc
    return path


def _write_position(f: h5py.File, grp: h5py.Group, parts: list[Any], checkpoints: Sequence[int] | None) -> None:
    """docs/positional.md: positional logits (two samples or more), the weights' key profile, the sink shares."""
    if parts[0].positional_mean is not None:
        _write(f, grp, POSITIONAL_MEAN, [p.positional_mean for p in parts], checkpoints)
        _write(f, grp, POSITIONAL_PROFILE, [p.positional_profile for p in parts], checkpoints)
        _write(f, grp, POSITIONAL_DIAGNOSTICS, [p.positional_diagnostics for p in parts], checkpoints)
    reduced = [p.reduced for p in parts]
    for name in datasets.reduced_rows():  # the rows its reducers give (the key profile, the sink shares)
        if all(name in r for r in reduced):
            _write(f, grp, name, [r[name] for r in reduced], checkpoints)
    measures = [getattr(p, "measures", None) or {} for p in parts]
    for name in datasets.MEASURE_ROWS:  # docs/position-measures.md: what the table lists and the summary holds
        if all(name in m for m in measures):
            _write(f, grp, name, [m[name] for m in measures], checkpoints)
    for name, keys in datasets.ROW_ATTRS.items():  # what says how to read a dataset (rotary pairs)
        if name in grp:
            grp[name].attrs.update({key: measures[0][key] for key in keys if key in measures[0]})
    if getattr(parts[0], "attended", None) is not None:  # the layer's own mask (docs/hdf5.md, 'Attended cells')
        _write(f, grp, ATTENDED, [p.attended for p in parts], checkpoints)
    if getattr(parts[0], "note", None):  # what the layer's summary leaves out, and why
        grp.attrs[LAYER_NOTE] = parts[0].note
    # which implementation formed them (both named, in order, where checkpoints differ)
    grp.attrs[LAYER_STATISTICS] = ", ".join(dict.fromkeys(getattr(p, "statistics", "torch") for p in parts))


def _root(f: h5py.File, attrs: Mapping[str, Any], input_ids: np.ndarray, n_heads: int, seq_len: int,
          resolution: int, block: int, layers: Sequence[int], checkpoints: Sequence[int] | None,
          causal: bool) -> None:  # fmt: skip
    ids = np.asarray(input_ids, dtype=np.int32).reshape(-1, seq_len)
    root = {**attrs, "biasviz_format": FORMAT_VERSION, "n_heads": n_heads, "seq_len": seq_len, "causal": causal,
            "layers": np.asarray(layers, dtype=np.int64), "samples": int(ids.shape[0]), "summary": True,
            "resolution": int(resolution), "block": int(block), "dtype": "float32",
            "created_utc": attrs.get("created_utc") or utc_now()}  # fmt: skip
    for key, value in root.items():
        f.attrs[key] = attr_value(key, value)
    starts = block_starts(seq_len, block)
    scales = {
        **({} if checkpoints is None else {"checkpoint": np.asarray(checkpoints, dtype=np.int64)}),
        "sample": np.arange(ids.shape[0], dtype=np.int32),
        "head": np.arange(1, n_heads + 1, dtype=np.int32),
        "query": np.arange(seq_len, dtype=np.int32),
        "query_block": starts,
        "key_block": starts.copy(),
        "stat": np.asarray([0, 1], dtype=np.int32),  # 0: mean, 1: std
        "operand": np.asarray([0, 1], dtype=np.int32),  # 0: q, 1: k
        "distance": np.arange(seq_len, dtype=np.int32),
        "key": np.arange(seq_len, dtype=np.int32),
        "from_key": np.asarray(POSITIONAL_FROM_KEYS, dtype=np.int32),
        "distance_bin": np.arange(len(datasets.distance_bins(seq_len)), dtype=np.int32),
        "segment": np.arange(datasets.SEGMENTS, dtype=np.int32),
        "rank": np.arange(datasets.SINK_RANKS, dtype=np.int32),
    }
    for name, values in scales.items():
        f.create_dataset(name, data=values).make_scale(name)
    f["stat"].attrs["names"] = "mean,std"
    f["operand"].attrs["names"] = "q,k"
    bins = f.create_dataset(datasets.DISTANCE_BINS, data=datasets.distance_bins(seq_len))
    bins.attrs["columns"] = "first,last"
    ds = f.create_dataset("input_ids", data=ids)
    _label(f, ds, ("sample", "query"))


def _write(f: h5py.File, grp: h5py.Group, name: str, parts: list[Any],
           checkpoints: Sequence[int] | None) -> h5py.Dataset:  # fmt: skip
    """One dataset of the table of datasets: its row gives the type it is stored as and the dimensions it is
    labelled with (a sweep's ``checkpoint`` in front)."""
    row = datasets.ROWS[name]
    data = np.asarray(parts[0] if checkpoints is None else np.stack([np.asarray(p) for p in parts]), dtype=row.dtype)
    if data.ndim >= 3 and data.nbytes > 1 << 20:
        ds = _write_compressed(grp, name, data)
    else:
        ds = grp.create_dataset(name, data=data)
    _label(f, ds, row.dims if checkpoints is None else ("checkpoint", *row.dims))
    return ds


def _write_compressed(grp: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    """``data`` with HDF5's shuffle and gzip filters, one chunk per matrix (its last two axes: a head's map, a
    statistic's profiles), compressed here in parallel (ISA-L where installed) and written as stored: h5py's own
    filter compresses in the one writing thread, most of a summary's write time at R = 1024."""
    chunk = (1,) * (data.ndim - 2) + data.shape[-2:]
    ds = grp.create_dataset(name, shape=data.shape, dtype=data.dtype, chunks=chunk, compression="gzip",
                            compression_opts=SUMMARY_DEFLATE_LEVEL, shuffle=True)  # fmt: skip
    leading = list(np.ndindex(data.shape[:-2]))
    with ThreadPoolExecutor(min(len(leading), compression_threads())) as pool:
        encoded = pool.map(lambda at: encode_chunk(data[at], SUMMARY_DEFLATE_LEVEL, shuffle=True), leading)
        for at, chunk_bytes in zip(leading, encoded, strict=True):
            ds.id.write_direct_chunk((*at, 0, 0), chunk_bytes, 0)
    return ds


def _label(f: h5py.File, ds: h5py.Dataset, dims: Sequence[str]) -> None:
    for axis, name in enumerate(dims):
        ds.dims[axis].label = name
        if name in f and f[name].shape == (ds.shape[axis],):  # a rotary pair's axis has no scale: its own length
            ds.dims[axis].attach_scale(f[name])


# attributes the summary layout sets itself
_SUMMARY_LAYOUT = {"biasviz_format", "n_heads", "seq_len", "causal", "layers", "samples", "summary", "resolution",
                   "block", "dtype"}  # fmt: skip


def join_summary_files(parts: Sequence[Path], out: Path, *, steps: Sequence[int], attrs: Mapping[str, Any],
                       force: bool = False) -> Path:  # fmt: skip
    """One sweep file from single-checkpoint summary files of the same windows: their arrays, stacked unchanged.

    Root attributes are the first part's (other than the layout's) updated by ``attrs``.
    """
    from types import SimpleNamespace

    per_step, first = [], None
    for part in parts:
        with h5py.File(part, "r") as f:
            a = f.attrs
            head = (int(a["n_heads"]), int(a["seq_len"]), int(a["resolution"]), int(a["block"]), bool(a["causal"]),
                    [int(x) for x in np.atleast_1d(a["layers"])])  # fmt: skip
            ids = f["input_ids"][()]
            if first is None:
                first = (head, ids, {k: v for k, v in a.items() if k not in _SUMMARY_LAYOUT})
            elif head != first[0] or not np.array_equal(ids, first[1]):
                raise BiasvizError(f"{part} was not made on the windows and settings of {parts[0]}; cannot join them")
            one: dict[int, dict[str, Any]] = {}
            for layer in head[5]:
                grp = f[layer_group(layer)]
                held = {name: grp[name][()] for name in datasets.ROWS if name in grp}  # every row, unchanged
                one[layer] = {kind: SimpleNamespace(
                    mean=held[map_name(kind, "mean")], std=held[map_name(kind, "std")],
                    profile=held[profile_name(kind)], diagnostics=held.get(DIAGNOSTICS) if kind == "bias" else None,
                ) for kind in KINDS if map_name(kind, "mean") in held}  # fmt: skip
                if KEY_PROFILE in held:
                    one[layer]["position"] = SimpleNamespace(
                        positional_mean=held.get(POSITIONAL_MEAN), positional_profile=held.get(POSITIONAL_PROFILE),
                        positional_diagnostics=held.get(POSITIONAL_DIAGNOSTICS),
                        reduced={name: held[name] for name in datasets.reduced_rows() if name in held},
                        attended=held.get(ATTENDED),
                        measures={**{name: held[name] for name in datasets.MEASURE_ROWS if name in held},
                                  **{key: grp[name].attrs[key] for name, keys in datasets.ROW_ATTRS.items()
                                     if name in grp for key in keys if key in grp[name].attrs}})  # fmt: skip
            per_step.append(one)
    assert first is not None, "no parts to join"
    (n_heads, seq_len, resolution, block, causal, layers), ids, meta = first
    return write_summary_file(out, attrs={**meta, **attrs}, input_ids=ids, n_heads=n_heads, seq_len=seq_len,
                              resolution=resolution, block=block, layers=layers, summaries=per_step,
                              checkpoints=steps, causal=causal, force=force)  # fmt: skip
