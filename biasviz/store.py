"""HDF5 format 1: how captured biases and attention weights are stored (SPEC section 4).

Layout::

    /                  attrs: biasviz_format=1, scheme, context_dependent, source_model, ...
    /input_ids         (sample, query) int32
    /layer_{L}/bias    (sample, head, query, key)   absent when the scheme adds no bias
    /layer_{L}/weights (sample, head, query, key)

Masked cells (key after query) hold NaN in ``bias`` and 0 in ``weights``. Files are written to a
temporary name beside the target and moved into place only when complete, so an interrupted run
never leaves a partial file at the target path.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.errors import BiasvizError

FORMAT_VERSION = 1
DIMS = ("sample", "head", "query", "key")
FLOAT16_MAX = float(np.finfo(np.float16).max)
REQUIRED_ATTRS = (
    "biasviz_format", "scheme", "context_dependent", "source_model", "model_sha256", "architecture",
    "n_layers", "n_heads", "seq_len", "layers", "samples", "dtype", "device", "seed", "text_source",
    "created_utc", "biasviz_version", "torch_version",
)  # fmt: skip


def layer_group(layer: int) -> str:
    """``layer_group(11) == 'layer_11'``: the group holding one layer's tensors."""
    return f"layer_{layer}"


def causal_cells(seq_len: int) -> np.ndarray:
    """Boolean (query, key) matrix, True where j <= i (the cells a causal model uses)."""
    return np.tril(np.ones((seq_len, seq_len), dtype=bool))


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _attr_value(key: str, value: Any) -> Any:
    """A value HDF5 stores as plain data: None -> '', lists -> arrays, dicts -> JSON text."""
    if value is None:
        return ""
    if isinstance(value, (str, Path)):
        return str(value)  # plain str: h5py cannot store str subclasses (torch's version string is one)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    if isinstance(value, (bool, int, float, np.generic, np.ndarray)):
        return value
    raise TypeError(f"attribute {key!r}: cannot store a {type(value).__name__} as HDF5 data")


def _chunk_rows(seq_len: int, itemsize: int) -> int:
    """Query rows per chunk: the whole (T, T) matrix, unless that passes HDF5's 4 GiB chunk limit.

    >>> _chunk_rows(512, 4), _chunk_rows(32768, 4)
    (512, 16384)
    """
    rows = seq_len
    while rows * seq_len * itemsize > 2**31:
        rows = (rows + 1) // 2
    return rows


class BiasFileWriter:
    """Streams captured batches into a new format-1 file; use as a context manager.

    The file appears at ``path`` only when the ``with`` block ends without error; on any error
    (or Ctrl-C) the temporary file is removed and an existing file at ``path`` is untouched.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        attrs: Mapping[str, Any],
        n_samples: int,
        n_heads: int,
        seq_len: int,
        layers: Sequence[int],
        has_bias: bool,
        dtype: str = "float32",
        force: bool = False,
        causal: bool = True,
        compression: str | None = "gzip",
        compression_opts: int | None = 1,
        shuffle: bool = True,
    ) -> None:
        self.path = Path(path)
        if dtype not in ("float32", "float16"):
            raise BiasvizError(f"unsupported storage dtype '{dtype}'; use float32 or float16")
        if self.path.exists() and not force:
            raise BiasvizError(f"{self.path} already exists; pass --force to overwrite it or choose another --out")
        self.force = force
        self.dtype = np.dtype(dtype)
        self.n_samples, self.n_heads, self.seq_len = n_samples, n_heads, seq_len
        self.layers = list(layers)
        self.has_bias = has_bias
        self.attrs = dict(attrs)
        self._filters = {"compression": compression, "compression_opts": compression_opts, "shuffle": shuffle}
        if compression is None:
            self._filters = {}
        self.causal = causal
        # True where masked; a bidirectional model (causal=False, e.g. a T5 encoder) uses every cell
        self._mask = ~causal_cells(seq_len) if causal else np.zeros((seq_len, seq_len), dtype=bool)
        self._tmp: Path | None = None
        self._h5: h5py.File | None = None
        self._written = 0

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> BiasFileWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BiasvizError(f"cannot create the output folder {self.path.parent}: {exc.strerror}") from exc
        self._tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self._h5 = h5py.File(self._tmp, "w")
        except OSError as exc:
            raise BiasvizError(f"cannot write to {self.path.parent}: {exc}") from exc
        try:
            self._create_layout()
        except BaseException:
            self._discard()
            raise
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        assert self._h5 is not None and self._tmp is not None
        try:
            if exc_type is None:
                if self._written != self.n_samples:
                    raise BiasvizError(f"only {self._written} of {self.n_samples} samples were written")
                self._h5.attrs["samples"] = self.n_samples
                self._h5.close()
                self._publish()
        except BaseException:
            self._discard()
            raise
        finally:
            if exc_type is not None:
                self._discard()

    def _discard(self) -> None:
        with contextlib.suppress(Exception):
            if self._h5 is not None:
                self._h5.close()
        with contextlib.suppress(FileNotFoundError):
            if self._tmp is not None:
                self._tmp.unlink()

    def _publish(self) -> None:
        """Move the finished file into place; without --force never replace a file that appeared meanwhile."""
        assert self._tmp is not None
        if self.force:
            os.replace(self._tmp, self.path)
            return
        try:
            os.link(self._tmp, self.path)  # atomic, fails if the target exists
        except FileExistsError:
            self._tmp.unlink()
            raise BiasvizError(f"{self.path} appeared while extracting; kept it, pass --force to overwrite") from None
        except OSError:  # no hard links on this file system
            if self.path.exists():
                raise BiasvizError(f"{self.path} appeared while extracting; pass --force to overwrite") from None
            os.replace(self._tmp, self.path)
            return
        self._tmp.unlink()

    # -- layout ----------------------------------------------------------------------------
    def _create_layout(self) -> None:
        f = self._h5
        assert f is not None
        attrs = {**self.attrs, "biasviz_format": FORMAT_VERSION, "dtype": self.dtype.name,
                 "n_heads": self.n_heads, "seq_len": self.seq_len, "causal": self.causal,
                 "layers": np.asarray(self.layers, dtype=np.int64),
                 "samples": 0, "created_utc": self.attrs.get("created_utc") or utc_now()}  # fmt: skip
        for key, value in attrs.items():
            f.attrs[key] = _attr_value(key, value)
        scales = {
            "sample": np.arange(self.n_samples, dtype=np.int32),
            "head": np.arange(1, self.n_heads + 1, dtype=np.int32),  # heads are numbered from 1, as in figures
            "query": np.arange(self.seq_len, dtype=np.int32),
            "key": np.arange(self.seq_len, dtype=np.int32),
        }
        for name, values in scales.items():
            ds = f.create_dataset(name, data=values)
            ds.make_scale(name)
        ids = f.create_dataset("input_ids", shape=(self.n_samples, self.seq_len), dtype=np.int32)
        self._label(ids, ("sample", "query"))
        shape = (self.n_samples, self.n_heads, self.seq_len, self.seq_len)
        chunks = (1, 1, _chunk_rows(self.seq_len, self.dtype.itemsize), self.seq_len)
        kinds = (["bias"] if self.has_bias else []) + ["weights"]
        for layer in self.layers:
            grp = f.create_group(layer_group(layer))
            for kind in kinds:
                fill = np.nan if kind == "bias" else 0.0
                ds = grp.create_dataset(kind, shape=shape, dtype=self.dtype, chunks=chunks, fillvalue=fill,
                                        **self._filters)  # fmt: skip
                self._label(ds, DIMS)

    def _label(self, ds: h5py.Dataset, dims: Sequence[str]) -> None:
        assert self._h5 is not None
        for axis, name in enumerate(dims):
            ds.dims[axis].label = name
            ds.dims[axis].attach_scale(self._h5[name])

    # -- data ------------------------------------------------------------------------------
    def _matrix(self, kind: str, layer: int, src: np.ndarray) -> np.ndarray:
        """One (query, key) matrix, masked and checked, in the storage dtype.

        Works on a copy, one matrix at a time: the caller's arrays (which may be the model's own
        tensors) are never modified, and the extra memory is one (T, T) matrix whatever the batch.
        """
        m = np.array(src, dtype=np.float32)  # (T, T) copy
        m[self._mask] = 0.0
        if not np.isfinite(m).all():
            raise BiasvizError(
                f"the captured {kind} of layer {layer} contains NaN or infinite values; "
                "the model's weights or inputs are broken"
            )
        if self.dtype == np.float16:
            peak = max(float(m.max()), -float(m.min()))
            if peak > FLOAT16_MAX:
                raise BiasvizError(
                    f"the {kind} of layer {layer} reaches {peak:.4g}, beyond float16's "
                    f"range ({FLOAT16_MAX:.0f}); store it with --dtype float32"
                )
        m[self._mask] = np.nan if kind == "bias" else 0.0
        return m.astype(self.dtype, copy=False)

    def _write_kind(self, kind: str, layer: int, array: Any, start: int, b: int) -> None:
        a = _as_numpy(array)  # (b or 1, H, T, T)
        expect = (self.n_heads, self.seq_len, self.seq_len)
        if a.ndim != 4 or tuple(a.shape[1:]) != expect or a.shape[0] not in (1, b):
            raise ValueError(f"{kind} of layer {layer} has shape {a.shape}, expected ({b} or 1, *{expect})")
        assert self._h5 is not None
        ds = self._h5[layer_group(layer)][kind]
        for s in range(b):
            src = a[s if a.shape[0] == b else 0]  # a (1, H, T, T) bias is the same for every sample
            for h in range(self.n_heads):
                ds[start + s, h] = self._matrix(kind, layer, src[h])  # exactly one chunk

    def write_batch(
        self,
        input_ids: Any,
        weights: Mapping[int, Any],
        bias: Mapping[int, Any] | None = None,
    ) -> None:
        """Append one batch: ``input_ids`` (b, T); per layer weights (b, H, T, T), bias (b or 1, H, T, T).

        Arrays may be NumPy arrays or CPU tensors; they are read, never modified.
        """
        f = self._h5
        assert f is not None, "use BiasFileWriter as a context manager"
        ids = _as_numpy(input_ids)
        b = int(ids.shape[0])
        start, stop = self._written, self._written + b
        if stop > self.n_samples:
            raise ValueError(f"more samples than the {self.n_samples} announced")
        if ids.shape != (b, self.seq_len):
            raise ValueError(f"input_ids has shape {ids.shape}, expected ({b}, {self.seq_len})")
        f["input_ids"][start:stop] = ids.astype(np.int32, copy=False)
        for layer in self.layers:
            self._write_kind("weights", layer, weights[layer], start, b)
            if self.has_bias:
                if bias is None or layer not in bias:
                    raise ValueError(f"no bias given for layer {layer}")
                self._write_kind("bias", layer, bias[layer], start, b)
        self._written = stop

    @property
    def written(self) -> int:
        """Samples written so far."""
        return self._written


def _as_numpy(array: Any) -> np.ndarray:
    """A NumPy view of an array or a CPU tensor (no copy when possible)."""
    if hasattr(array, "detach"):  # a torch tensor; torch is not imported here so readers stay light
        return array.detach().cpu().numpy()
    return np.asarray(array)


class BiasFile:
    """A format-1 file opened for reading; arrays are read lazily, one selection at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise BiasvizError(f"{self.path} does not exist; run 'biasviz extract' first or pass --input")
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as exc:
            raise BiasvizError(f"{self.path} is not a readable HDF5 file (truncated or another format): {exc}") from exc
        try:
            self._validate()
        except BaseException:
            self._h5.close()
            raise

    def _validate(self) -> None:
        a = self._h5.attrs
        if "biasviz_format" not in a:
            raise BiasvizError(f"{self.path} is an HDF5 file but not a biasviz file (no biasviz_format attribute)")
        try:
            version = int(np.asarray(a["biasviz_format"]).item())
        except (TypeError, ValueError):
            raise BiasvizError(f"{self.path} has an unreadable biasviz_format attribute") from None
        if version != FORMAT_VERSION:
            raise BiasvizError(
                f"{self.path} is biasviz format {version}; this biasviz reads format {FORMAT_VERSION} (upgrade biasviz)"
            )
        missing = [k for k in REQUIRED_ATTRS if k not in a]
        if missing:
            raise BiasvizError(f"{self.path} lacks required attributes: {', '.join(missing)}")
        for layer in self.layers:
            if layer_group(layer) not in self._h5 or "weights" not in self._h5[layer_group(layer)]:
                raise BiasvizError(f"{self.path} lists layer {layer} but has no {layer_group(layer)}/weights")

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> BiasFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._h5.close()

    # -- metadata ------------------------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        """Root attributes as plain Python values (data only; nothing is evaluated)."""
        out: dict[str, Any] = {}
        for k, v in self._h5.attrs.items():
            if isinstance(v, bytes):
                v = v.decode("utf-8", "replace")
            elif isinstance(v, np.ndarray):
                v = v.tolist()
            elif isinstance(v, np.generic):
                v = v.item()
            out[k] = v
        return out

    def _attr(self, key: str) -> Any:
        v = self._h5.attrs[key]
        return v.decode() if isinstance(v, bytes) else v

    @property
    def scheme(self) -> str:
        return str(self._attr("scheme"))

    @property
    def context_dependent(self) -> bool:
        return bool(self._attr("context_dependent"))

    @property
    def layers(self) -> list[int]:
        return [int(x) for x in np.atleast_1d(self._h5.attrs["layers"])]

    @property
    def n_heads(self) -> int:
        return int(self._attr("n_heads"))

    @property
    def seq_len(self) -> int:
        return int(self._attr("seq_len"))

    @property
    def causal(self) -> bool:
        """False for bidirectional models, whose cells above the diagonal are used (and stored)."""
        return bool(self._h5.attrs.get("causal", True))

    @property
    def n_samples(self) -> int:
        return int(self._h5["input_ids"].shape[0])

    def resolve_layer(self, layer: int) -> int:
        """Accept negative indices (``-1`` = the last layer stored) and check the layer exists."""
        layers = self.layers
        if layer < 0:
            if -layer > len(layers):
                raise BiasvizError(f"layer {layer} out of range; {self.path} holds layers {layers}")
            return sorted(layers)[layer]
        if layer not in layers:
            raise BiasvizError(f"layer {layer} is not in {self.path}; it holds layers {layers}")
        return layer

    def has_bias(self, layer: int = -1) -> bool:
        return "bias" in self._h5[layer_group(self.resolve_layer(layer))]

    # -- data ----------------------------------------------------------------------------------
    def dataset(self, kind: str, layer: int = -1) -> h5py.Dataset:
        """The raw (sample, head, query, key) dataset, for reading slices without loading it all."""
        grp = self._h5[layer_group(self.resolve_layer(layer))]
        if kind not in grp:
            raise BiasvizError(f"{self.path} holds no {kind} (scheme '{self.scheme}' adds no bias)")
        return grp[kind]

    def read(self, kind: str, layer: int = -1, sample: int | slice | None = None) -> np.ndarray:
        """``kind`` ('bias' or 'weights') as float32: (sample, head, query, key), or
        (head, query, key) for one integer ``sample``."""
        ds = self.dataset(kind, layer)
        sel: Any = slice(None) if sample is None else sample
        if isinstance(sel, int) and not -ds.shape[0] <= sel < ds.shape[0]:
            raise BiasvizError(f"sample {sel} out of range; {self.path} holds {ds.shape[0]} samples")
        return np.asarray(ds[sel], dtype=np.float32)

    def input_ids(self) -> np.ndarray:
        return np.asarray(self._h5["input_ids"][()])

    def iter_samples(self, kind: str, layer: int = -1) -> Iterator[np.ndarray]:
        """One (head, query, key) array per sample, so memory stays bounded by one sample."""
        ds = self.dataset(kind, layer)
        for s in range(ds.shape[0]):
            yield np.asarray(ds[s], dtype=np.float32)


def open_bias_file(path: str | Path) -> BiasFile:
    """Open and validate a format-1 file; clear errors for anything else."""
    return BiasFile(path)
