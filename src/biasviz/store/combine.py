"""Joining format-1 files of one model into one: the shards of a data-parallel run, or a checkpoint sweep.

Shards (``along="sample"``) are concatenated in rank order, so the result holds the samples in the
order and with the numbers of a one-process run. Checkpoints (``along="checkpoint"``) share their
token windows and become a leading ``checkpoint`` dimension, scaled by the training steps.

Matrices are copied as the compressed chunks they are stored as (HDF5's direct chunk read and write):
no decompression, no recompression, and the bytes are exactly the parts' bytes (lzf's go through h5py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.store.format import BIAS_DIFFERENCE
from biasviz.store.reader import open_bias_file
from biasviz.store.writer import BiasFileWriter

# attributes the writer sets from the layout itself
_LAYOUT_ATTRS = {"biasviz_format", "dtype", "n_heads", "seq_len", "causal", "layers", "samples", "bias_shared"}


def _same(parts: Sequence[Any], what: str, get: Any) -> Any:
    values = [get(p) for p in parts]
    if any(v != values[0] for v in values[1:]):
        raise BiasvizError(f"cannot join files with different {what}: {values}")
    return values[0]


def combine(parts: Sequence[Path], out: Path, *, along: str, steps: Sequence[int] | None = None,
            force: bool = False, attrs: Mapping[str, Any] | None = None) -> Path:  # fmt: skip
    """Write ``out`` from ``parts`` (complete format-1 files); see the module docstring."""
    if along not in ("sample", "checkpoint"):
        raise ValueError(f"along must be 'sample' or 'checkpoint', not {along!r}")
    if along == "checkpoint" and (steps is None or len(steps) != len(parts)):
        raise ValueError("a sweep needs one training step per part")
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_bias_file(p)) for p in parts]  # validated, and refused if a sweep
        if any(f.checkpoints is not None for f in files):
            raise BiasvizError("cannot join sweep files; join the single-checkpoint files they were made from")
        layers = _same(files, "layers", lambda f: f.layers)
        heads = _same(files, "head counts", lambda f: f.n_heads)
        seq_len = _same(files, "lengths", lambda f: f.seq_len)
        causal = _same(files, "masks", lambda f: f.causal)
        rules = _same(files, "masks", lambda f: {layer: f.layer_causal(layer) for layer in f.layers})
        dtype = _same(files, "storage types", lambda f: f.attrs["dtype"])
        kinds = _same(files, "contents", lambda f: ["bias"] * f.has_bias(layers[0]) + ["weights"] * (not f.bias_only)
                      + ["scores"] * f.has_scores(layers[0]))  # fmt: skip
        ids = [f.input_ids() for f in files]
        stored = files[0].dataset(kinds[-1], layers[0])  # the parts' filters (extract --compression) are the result's
        filters = {"compression": stored.compression, "compression_opts": stored.compression_opts,
                   "shuffle": bool(stored.shuffle)}  # fmt: skip
        if along == "checkpoint" and any(not np.array_equal(i, ids[0]) for i in ids[1:]):
            raise BiasvizError("the checkpoints were run on different token windows; a sweep needs the same ones")
        meta = {k: v for k, v in files[0].attrs.items() if k not in _LAYOUT_ATTRS} | dict(attrs or {})
        shared = all(f.bias_shared for f in files)
        if along == "sample" and BIAS_DIFFERENCE in meta:  # measured in each part, and between parts here
            gap = max([float(f.attrs.get(BIAS_DIFFERENCE, 0.0)) for f in files]
                      + ([_largest_gap(files, layers)] if shared else []))  # fmt: skip
            meta[BIAS_DIFFERENCE] = gap
            shared = shared and gap == 0.0
        n_samples = sum(len(i) for i in ids) if along == "sample" else len(ids[0])
        writer = BiasFileWriter(out, attrs=meta, n_samples=n_samples, n_heads=heads, seq_len=seq_len, layers=layers,
                                has_bias="bias" in kinds, has_weights="weights" in kinds, has_scores="scores" in kinds,
                                dtype=dtype, force=force, **filters,
                                causal=causal, layer_causal=rules,
                                checkpoints=steps if along == "checkpoint" else None,
                                bias_shared=shared)  # fmt: skip
        with writer:
            if along == "checkpoint":
                writer.begin_batch(ids[0])
            for index, (part, part_ids) in enumerate(zip(files, ids, strict=True)):
                first = writer.begin_batch(part_ids) if along == "sample" else 0
                checkpoint = index if along == "checkpoint" else None
                for layer in layers:
                    for kind in kinds:
                        _copy(part.dataset(kind, layer), writer, kind, layer, first, checkpoint)
    return out


def _largest_gap(files: Sequence[Any], layers: Sequence[int]) -> float:
    """The largest |b - b_first| between the stored (shared) biases of the parts, over used cells."""
    gap = 0.0
    for layer in layers:
        first = files[0].dataset("bias", layer)
        for other in files[1:]:
            ds = other.dataset("bias", layer)
            for h in range(files[0].n_heads):  # one (T, T) matrix at a time
                d = np.abs(np.asarray(ds[0, h], dtype=np.float64) - np.asarray(first[0, h], dtype=np.float64))
                gap = max(gap, float(np.nan_to_num(d, nan=0.0).max()))
    return gap


def _copy(src: h5py.Dataset, writer: BiasFileWriter, kind: str, layer: int, first: int,
          checkpoint: int | None) -> None:  # fmt: skip
    """Every (sample, head) matrix of ``src`` into the writer, as stored chunks where the layouts agree."""
    shared = getattr(src, "shared", False)  # a bias stored once for every sample: its chunks are one sample's
    direct = (writer.direct_chunks and not shared and src.chunks == (1, 1, writer.seq_len, writer.seq_len)
              and src.compression == ("gzip" if writer.deflate_level is not None else None)
              and bool(src.shuffle) == writer.shuffled)  # fmt: skip
    samples, heads = src.shape[:2]
    if kind == "bias" and writer.bias_shared:  # stored once: the first sample stands for all
        samples = 1 if first == 0 else 0
    for s in range(samples):
        for h in range(heads):
            if direct:
                mask, data = src.id.read_direct_chunk((s, h, 0, 0))
                if mask == 0:  # every filter was applied: the bytes are what the writer would store
                    writer.write_chunk(kind, layer, first + s, h, data, checkpoint=checkpoint)
                    continue
            writer.write_matrix(kind, layer, first + s, h, src[s, h], checkpoint=checkpoint)
