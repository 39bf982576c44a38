"""Writing format-1 files: batches (or chunks already encoded elsewhere) streamed into a temporary file
that is moved into place only when complete, so an interrupted run never leaves a partial file."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.common.atomic import publish, temporary_name
from biasviz.common.errors import BiasvizError, os_error_message
from biasviz.common.exclusive import writing_alone
from biasviz.common.outputs import appeared_meanwhile
from biasviz.store.deflate import compression_threads, encode_chunk
from biasviz.store.failures import DeferredWriteErrors
from biasviz.store.format import (
    DIMS,
    FLOAT16_MAX,
    FORMAT_VERSION,
    causal_cells,
    chunk_rows,
    float16_overflow_error,
    layer_group,
    non_finite_error,
    utc_now,
)
from biasviz.store.h5io import as_numpy, attr_value, drop_pending_writes
from biasviz.store.shared_bias import SharedBiasSwitch


class BiasFileWriter(SharedBiasSwitch):
    """Streams captured batches into a new format-1 file; use as a context manager.

    The file appears at ``path`` only when the ``with`` block ends without error; on any error
    (or Ctrl-C) the temporary file is removed and an existing file at ``path`` is untouched.
    """

    def __init__(
        self, path: str | Path, *, attrs: Mapping[str, Any], n_samples: int, n_heads: int, seq_len: int,
        layers: Sequence[int], has_bias: bool, has_weights: bool = True, has_scores: bool = False,
        dtype: str = "float32", force: bool = False, causal: bool = True, compression: str | None = "gzip",
        compression_opts: int | None = 1, shuffle: bool = True, workers: int | None = None,
        checkpoints: Sequence[int] | None = None, bias_shared: bool = False,
        layer_causal: Mapping[int, bool] | None = None,
    ) -> None:  # fmt: skip
        self.path = Path(path)
        # a context-free bias: stored once as (1, H, T, T) for every sample (root attribute bias_shared)
        self.bias_shared = bool(bias_shared) and has_bias
        # a sweep: bias and weights gain a leading "checkpoint" dimension, scaled by these training steps
        self.checkpoints = None if checkpoints is None else [int(x) for x in checkpoints]
        if dtype not in ("float32", "float16"):
            raise BiasvizError(f"unsupported storage dtype '{dtype}'; use float32 or float16")
        if self.path.exists() and not force:
            raise BiasvizError(f"{self.path} already exists; pass --force to overwrite it or choose another --out")
        self.force = force
        self.dtype = np.dtype(dtype)
        self.n_samples, self.n_heads, self.seq_len = n_samples, n_heads, seq_len
        self.layers = list(layers)
        self.has_bias = has_bias
        self.has_weights = has_weights  # False: a bias-only file (extract --bias-only), no forward pass ran
        self.has_scores = has_scores  # the softmax's input too (extract --capture ...,scores; docs/positional.md)
        if not (has_bias or has_weights):
            raise ValueError("a file needs the bias, the weights or both")
        self.attrs = dict(attrs)
        self._filters = {"compression": compression, "compression_opts": compression_opts, "shuffle": shuffle}
        if compression is None:
            self._filters = {}
        self.causal = causal
        # each layer's own rule where the model's calls differ (an encoder-decoder's causal decoder self-attention
        # beside calls that see every key): its group's attribute 'causal', its cells past the query NaN in its bias
        self.layer_causal = {layer: bool((layer_causal or {}).get(layer, causal)) for layer in self.layers}
        self._chunk_rows = chunk_rows(seq_len, self.dtype.itemsize)
        # compression threads (gzip): all cores by default; 1 compresses in the calling thread
        self._workers = compression_threads(workers)
        self._executor: ThreadPoolExecutor | None = None
        # True where masked, for each rule the layers take (a (T, T) mask each: only those used); a bidirectional call
        # (a T5 encoder's) uses every cell
        self._masks = {rule: ~causal_cells(seq_len) if rule else np.zeros((seq_len, seq_len), dtype=bool)
                       for rule in set(self.layer_causal.values())}  # fmt: skip
        self._tmp: Path | None = None
        self._alone: contextlib.AbstractContextManager[None] | None = None
        self._h5: h5py.File | None = None
        self._written = 0
        self._failures = DeferredWriteErrors()

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> BiasFileWriter:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BiasvizError(
                f"cannot create the output folder {self.path.parent}: {exc.strerror}; choose another --out"
            ) from exc
        self._alone = writing_alone(self.path)
        try:
            self._alone.__enter__()  # a second process writing this file fails here; stale temporaries go
        except OSError as exc:
            raise BiasvizError(os_error_message(exc, self.path)) from exc
        self._tmp = temporary_name(self.path)
        self._failures.__enter__()
        try:
            self._h5 = h5py.File(self._tmp, "w")
            self._create_layout()
            self._failures.check()
        except BaseException as exc:  # an interrupt can land after the file exists but before it is returned
            self._discard()
            self._release()
            if isinstance(exc, OSError):
                raise BiasvizError(os_error_message(exc, self.path)) from exc
            raise
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        assert self._h5 is not None and self._tmp is not None
        try:
            if exc_type is None:
                if self._written != self.n_samples:
                    raise BiasvizError(f"only {self._written} of {self.n_samples} samples were written")
                self._h5.attrs["samples"] = self.n_samples
                self._shutdown()
                self._failures.check()
                self._h5.flush()  # a full disk fails here, while the file can still be closed safely
                self._failures.check()
                self._h5.close()
                self._failures.check()
                self._publish()
        except OSError as err:
            self._discard()
            raise BiasvizError(os_error_message(err, self.path)) from err
        except BaseException:
            self._discard()
            raise
        finally:
            if exc_type is not None:
                self._discard()
            self._failures.__exit__()
            self._release()
        if isinstance(exc, OSError):  # a write inside the block failed (full disk, ...): name the file
            raise BiasvizError(os_error_message(exc, self.path)) from exc

    def _release(self) -> None:
        alone, self._alone = self._alone, None
        if alone is not None:
            alone.__exit__(None, None, None)

    def _discard(self) -> None:
        self._shutdown()
        with contextlib.suppress(Exception):
            if self._h5 is not None:
                if self._h5.id.valid:
                    drop_pending_writes(self._h5)
                self._h5.close()
        with contextlib.suppress(FileNotFoundError):
            if self._tmp is not None:
                self._tmp.unlink()
        self._failures.__exit__()

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def _publish(self) -> None:
        """Move the finished file into place; without --force never replace a file that appeared meanwhile."""
        assert self._tmp is not None
        try:
            publish(self._tmp, self.path, overwrite=self.force)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                self._tmp.unlink()
            raise appeared_meanwhile(self.path) from None

    # -- layout ----------------------------------------------------------------------------
    def _create_layout(self) -> None:
        f = self._h5
        assert f is not None
        attrs = {**self.attrs, "biasviz_format": FORMAT_VERSION, "dtype": self.dtype.name,
                 "n_heads": self.n_heads, "seq_len": self.seq_len, "causal": self.causal,
                 "layers": np.asarray(self.layers, dtype=np.int64),
                 "samples": 0, "created_utc": self.attrs.get("created_utc") or utc_now()}  # fmt: skip
        if self.bias_shared:
            attrs["bias_shared"] = True
        for key, value in attrs.items():
            f.attrs[key] = attr_value(key, value)
        scales = {
            **({} if self.checkpoints is None else {"checkpoint": np.asarray(self.checkpoints, dtype=np.int64)}),
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
        lead = () if self.checkpoints is None else (len(self.checkpoints),)
        shape = (*lead, self.n_samples, self.n_heads, self.seq_len, self.seq_len)
        chunks = (*(1,) * len(lead), 1, 1, self._chunk_rows, self.seq_len)
        dims = DIMS if self.checkpoints is None else ("checkpoint", *DIMS)
        kinds = [kind for kind, held in (("bias", self.has_bias), ("weights", self.has_weights),
                                         ("scores", self.has_scores)) if held]  # fmt: skip
        for layer in self.layers:
            grp = f.create_group(layer_group(layer))
            if self.layer_causal[layer] != self.causal:
                grp.attrs["causal"] = self.layer_causal[layer]
            for kind in kinds:
                fill = 0.0 if kind == "weights" else np.nan
                one = (*lead, 1, *shape[len(lead) + 1 :])  # a shared bias: one sample stands for all
                ds = grp.create_dataset(kind, shape=one if kind == "bias" and self.bias_shared else shape,
                                        dtype=self.dtype, chunks=chunks, fillvalue=fill, **self._filters)  # fmt: skip
                self._label(ds, dims)

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
        m, mask = np.array(src, dtype=np.float32), self._masks[self.layer_causal[layer]]  # (T, T) copy
        np.copyto(m, 0.0, where=mask)
        # one float64 sum is finite exactly when every cell is (it cannot overflow for float32 inputs),
        # and costs a fraction of an elementwise isfinite pass with its (T, T) boolean temporary
        if not np.isfinite(m.sum(dtype=np.float64)):
            raise non_finite_error(kind, layer)
        if self.dtype == np.float16:
            peak = max(float(m.max()), -float(m.min()))
            if peak > FLOAT16_MAX:
                raise float16_overflow_error(kind, layer, peak)
        if kind != "weights":  # a bias or scores: no value where a query does not look
            np.copyto(m, np.nan, where=mask)
        return m.astype(self.dtype, copy=False)

    def _encode(self, kind: str, layer: int, src: np.ndarray) -> bytes | memoryview:
        """One matrix as the bytes HDF5's filters (shuffle + deflate, or none) would store for its single chunk.

        Runs in worker threads: NumPy and deflate release the GIL, so matrices compress in parallel.
        """
        return encode_chunk(self._matrix(kind, layer, src), self.deflate_level, self.shuffled)

    def _direct(self) -> bool:
        """Whether chunks are encoded here (in parallel) and written as they are stored.

        Only for gzip or no filter, with one chunk per matrix; lzf goes through h5py, one matrix at a time.
        """
        return self._filters.get("compression") in ("gzip", None) and self._chunk_rows == self.seq_len

    def _write_kind(self, kind: str, layer: int, array: Any, start: int, b: int) -> None:
        a = as_numpy(array)  # (b or 1, H, T, T)
        expect = (self.n_heads, self.seq_len, self.seq_len)
        if a.ndim != 4 or tuple(a.shape[1:]) != expect or a.shape[0] not in (1, b):
            raise ValueError(f"{kind} of layer {layer} has shape {a.shape}, expected ({b} or 1, *{expect})")
        assert self._h5 is not None
        ds = self._h5[layer_group(layer)][kind]
        if kind == "bias" and self.bias_shared:  # stored once, from the first batch
            if start > 0:
                return
            a, b = a[:1], 1
        # a (1, H, T, T) bias is the same for every sample: encoded once, stored b times
        distinct = [(s, h) for s in range(a.shape[0]) for h in range(self.n_heads)]
        if not self._direct():
            for s in range(b):
                src = a[s if a.shape[0] == b else 0]
                for h in range(self.n_heads):
                    ds[start + s, h] = self._matrix(kind, layer, src[h])  # exactly one chunk
            return
        pool = self._pool()
        # one matrix per worker in flight (each a float32 copy plus its shuffled bytes): memory stays bounded
        window = self._workers
        pending: list[tuple[tuple[int, int], Any]] = []

        def flush(item: tuple[tuple[int, int], Any]) -> None:
            (s, h), fut = item
            data = fut.result() if pool is not None else fut
            for target in range(b) if a.shape[0] == 1 else (s,):
                ds.id.write_direct_chunk((start + target, h, 0, 0), data, 0)

        for s, h in distinct:
            if pool is None:
                flush(((s, h), self._encode(kind, layer, a[s, h])))
                continue
            pending.append(((s, h), pool.submit(self._encode, kind, layer, a[s, h])))
            if len(pending) >= window:
                flush(pending.pop(0))
        for item in pending:
            flush(item)

    def _pool(self) -> ThreadPoolExecutor | None:
        if self._workers <= 1:
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="biasviz-write")
        return self._executor

    @property
    def direct_chunks(self) -> bool:
        """True when each matrix is one chunk (gzip or none) that may be handed over encoded (:meth:`write_chunk`)."""
        return self._direct()

    @property
    def deflate_level(self) -> int | None:
        """gzip's level (h5py's default 4 when none was given); None where nothing is deflated."""
        opts = self._filters.get("compression_opts")
        return (4 if opts is None else int(opts)) if self._filters.get("compression") == "gzip" else None

    @property
    def shuffled(self) -> bool:
        return bool(self._filters.get("shuffle"))

    def begin_batch(self, input_ids: Any) -> int:
        """Store a batch's token ids ahead of its matrices (given by :meth:`write_chunk`); returns its first sample."""
        assert self._h5 is not None, "use BiasFileWriter as a context manager"
        self._failures.check()
        ids = as_numpy(input_ids)
        b = int(ids.shape[0])
        start, stop = self._written, self._written + b
        if stop > self.n_samples:
            raise ValueError(f"more samples than the {self.n_samples} announced")
        if ids.shape != (b, self.seq_len):
            raise ValueError(f"input_ids has shape {ids.shape}, expected ({b}, {self.seq_len})")
        self._h5["input_ids"][start:stop] = ids.astype(np.int32, copy=False)
        self._written = stop
        return start

    def _at(self, sample: int, head: int, checkpoint: int | None) -> tuple[int, ...]:
        if (checkpoint is None) != (self.checkpoints is None):
            raise ValueError("a checkpoint index is given exactly when the file is a sweep")
        return (sample, head) if checkpoint is None else (checkpoint, sample, head)

    def write_chunk(self, kind: str, layer: int, sample: int, head: int, data: bytes,
                    checkpoint: int | None = None) -> None:  # fmt: skip
        """Store one (sample, head) matrix given as its shuffled and deflated chunk bytes (``direct_chunks`` only)."""
        assert self._h5 is not None and self._direct()
        self._failures.check()
        if self._skip(kind, sample):
            return
        self._h5[layer_group(layer)][kind].id.write_direct_chunk((*self._at(sample, head, checkpoint), 0, 0), data, 0)

    def write_matrix(self, kind: str, layer: int, sample: int, head: int, matrix: Any,
                     checkpoint: int | None = None) -> None:  # fmt: skip
        """Store one (query, key) matrix (masked and checked as every matrix is), wherever it came from."""
        assert self._h5 is not None
        self._failures.check()
        if self._skip(kind, sample):
            return
        self._h5[layer_group(layer)][kind][self._at(sample, head, checkpoint)] = self._matrix(kind, layer, matrix)

    def write_batch(
        self,
        input_ids: Any,
        weights: Mapping[int, Any],
        bias: Mapping[int, Any] | None = None,
        scores: Mapping[int, Any] | None = None,
    ) -> None:
        """Append one batch: ``input_ids`` (b, T); per layer weights (b, H, T, T), bias (b or 1, H, T, T) and,
        in a file that holds them, scores (b, H, T, T).

        Arrays may be NumPy arrays or CPU tensors; they are read, never modified.
        """
        start = self.begin_batch(input_ids)
        b = self._written - start
        for layer in self.layers:
            if self.has_weights:
                self._write_kind("weights", layer, weights[layer], start, b)
            if self.has_bias:
                if bias is None or layer not in bias:
                    raise ValueError(f"no bias given for layer {layer}")
                self._write_kind("bias", layer, bias[layer], start, b)
            if self.has_scores:
                if scores is None or layer not in scores:
                    raise ValueError(f"no scores given for layer {layer}")
                self._write_kind("scores", layer, scores[layer], start, b)

    @property
    def written(self) -> int:
        """Samples written so far."""
        return self._written


