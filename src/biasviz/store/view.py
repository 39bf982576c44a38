"""A read-only, labelled view of a format-1 file (full, summary or sweep): what ``biasviz.open`` returns.

Every array comes through :class:`~biasviz.store.reader.BiasFile`, so a view checks and reads a file exactly as
the commands do (a shared bias broadcast over samples, a summary's empty blocks NaN). This module only puts
names on what the reader returns: layers, heads numbered from 1 (as in figures), samples and training steps,
and the file's HDF5 dimension scales as the dimensions and coordinates of :meth:`FileView.to_xarray`
(:mod:`.labelled`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.arguments import ArgumentTypeError, ArgumentValueError, pick, whole
from biasviz.common.errors import BiasvizError
from biasviz.store import datasets, labelled
from biasviz.store import format as fmt
from biasviz.store.datasets import ROWS
from biasviz.store.labelled import MATRICES
from biasviz.store.reader import BiasFile, open_bias_file


class FileView:
    """A biasviz file opened read-only, addressed by layer, head (from 1), sample and training step.

    ``view.bias(layer=-1, sample=0)``, ``view.weights(head=3)``, ``view["layer_3/bias_mean"]`` and
    ``view.to_xarray()``; close it (or use ``with``) to release the file.
    """

    def __init__(self, path: str | Path, *, isolated: bool = True) -> None:
        self._file: BiasFile = open_bias_file(path, isolated=isolated)
        self._closed = False

    @property
    def _f(self) -> BiasFile:
        """The open file; after :meth:`close` every use is one clear ValueError (not h5py's invalid object id)."""
        if self._closed:
            raise ArgumentValueError(f"this view of {self._file.path} is closed; open the file again with "
                                     f"biasviz.open({str(self._file.path)!r})")  # fmt: skip
        return self._file

    # -- what the file is ------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        """The file's path."""
        return self._file.path

    @property
    def kind(self) -> str:
        """``summary`` (extract --summary: block means, profiles, diagnostics) or ``full`` (every sample's)."""
        return "summary" if self._f.is_summary else "full"

    @property
    def scheme(self) -> str:
        """The scheme the file records (``captured`` for a traced model whose scheme was not named)."""
        return self._f.scheme

    @property
    def layers(self) -> list[int]:
        """The layers stored (0-based, as in ``layer_L``)."""
        return self._f.layers

    @property
    def heads(self) -> list[int]:
        """Head numbers, from 1 as in figures and in the file's ``/head`` scale."""
        return list(range(1, self._f.n_heads + 1))

    @property
    def samples(self) -> list[int]:
        """Sample indices, from 0 (the windows of ``input_ids``)."""
        return list(range(self._f.n_samples))

    @property
    def seq_len(self) -> int:
        """T: the positions of each window."""
        return self._f.seq_len

    @property
    def steps(self) -> list[int] | None:
        """The training steps of a sweep's checkpoints (``extract --checkpoints``); None for one checkpoint."""
        return self._f.checkpoints

    @property
    def attrs(self) -> dict[str, Any]:
        """The root attributes, read as plain data."""
        return self._f.attrs

    def close(self) -> None:
        """Release the file (``with biasviz.open(...) as view:`` does it on leaving the block); again: nothing."""
        if not self._closed:
            self._closed = True
            self._file.close()

    def __enter__(self) -> FileView:
        self._f  # noqa: B018 - a closed view cannot be entered
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"<biasviz file {self.path} (closed)>"
        steps = f", steps {self.steps}" if self.steps else ""
        return (f"<biasviz {self.kind} file {self.path}: {self.scheme}, layers {self.layers}, {len(self.heads)} heads,"
                f" {len(self.samples)} samples, T = {self.seq_len}{steps}>")  # fmt: skip

    # -- labelled arrays -------------------------------------------------------------------------------
    def bias(self, layer: int = -1, *, sample: int | str | None = None, head: int | None = None,
             step: int | None = None) -> np.ndarray:  # fmt: skip
        """The bias of ``layer``: (sample, head, query, key) of a full file, (head, query_block, key_block) of a
        summary's mean map. ``sample``: an index (the axis dropped) or ``'mean'``; ``head``: a head from 1;
        ``step``: a sweep's checkpoint by training step (None: every checkpoint, a leading axis)."""
        return self._matrix("bias", layer, sample, head, step)

    def weights(self, layer: int = -1, *, sample: int | str | None = None, head: int | None = None,
                step: int | None = None) -> np.ndarray:  # fmt: skip
        """The post-softmax attention weights, addressed as :meth:`bias`."""
        return self._matrix("weights", layer, sample, head, step)

    def scores(self, layer: int = -1, *, sample: int | str | None = None, head: int | None = None,
               step: int | None = None) -> np.ndarray:  # fmt: skip
        """The softmax's input (stored with ``--capture ...,scores``, and in every summary), as :meth:`bias`."""
        return self._matrix("scores", layer, sample, head, step)

    def keys(self) -> list[str]:
        """The names ``view[name]`` reads: ``input_ids`` and ``layer_L/DATASET`` of every layer."""
        groups = [(fmt.layer_group(layer), self._held(layer)) for layer in self.layers]
        return ["input_ids", *(f"{group}/{name}" for group, names in groups for name in names)]

    def __getitem__(self, name: str) -> np.ndarray:
        """``view["layer_3/bias_mean"]``, ``view["layer_3/weights"]``, ``view["input_ids"]``: the dataset as the
        reader reads it, every checkpoint of a sweep along a leading axis."""
        _check_name(name, self.path)
        if name == "input_ids":
            return self._f.input_ids()
        group, _, dataset = name.partition("/")
        if group.startswith("layer_") and group[6:].isdigit() and int(group[6:]) in self.layers:
            layer = int(group[6:])
            if dataset in self._held(layer):
                return self._each_step(lambda f: _read(f, layer, dataset), None)
        raise KeyError(f"{name!r} is not in {self.path}; it holds {', '.join(self.keys())}")

    def dims(self, name: str) -> list[tuple[str, np.ndarray | None]]:
        """``(label, coordinate values or None)`` of each dimension of ``name`` (as in :meth:`keys`), read from the
        file's HDF5 dimension scales; a scale with a ``names`` attribute (``stat``) gives those names."""
        _check_name(name, self.path)
        if name != "input_ids" and name not in self.keys():
            raise KeyError(f"{name!r} is not in {self.path}; it holds {', '.join(self.keys())}")
        return labelled.dims(self._f, name)

    def to_xarray(self, layer: int | None = -1) -> Any:
        """The layer's datasets (and ``input_ids``) as an ``xarray.Dataset``, dimensions and coordinates from the
        file's dimension scales; ``layer=None``: every layer, along a ``layer`` dimension. Needs the extra
        ``biasviz[xarray]``."""
        chosen = None if layer is None else pick("layer", layer, self.layers, self.path, negative=True)
        return labelled.to_xarray(self, chosen)

    # -- helpers ---------------------------------------------------------------------------------------
    def _held(self, layer: int) -> tuple[str, ...]:
        f = self._f
        if f.is_summary:
            return f.summary_datasets(layer)
        return tuple(k for k, held in zip(MATRICES, (f.has_bias(layer), not f.bias_only, f.has_scores(layer)),
                                          strict=True) if held)  # fmt: skip

    def _each_step(self, read: Any, step: int | None) -> Any:
        """``read(BiasFile)`` at one checkpoint (``step``), or stacked over every checkpoint of a sweep."""
        steps = self.steps
        if step is not None:
            whole("step", step, "a training step of a sweep's checkpoints, or None")
        if steps is None:
            if step is not None:
                raise ArgumentValueError(f"step {step!r}: {self.path} is not a sweep (one checkpoint); leave step "
                                         "out")  # fmt: skip
            return read(self._f)
        if step is not None:
            return read(self._f.at_checkpoint(steps.index(pick("step", step, steps, self.path))))
        parts = [read(self._f.at_checkpoint(k)) for k in range(len(steps))]
        return np.stack(parts) if isinstance(parts[0], np.ndarray) else parts

    def _matrix(self, kind: str, layer: int, sample: int | str | None, head: int | None,
                step: int | None) -> np.ndarray:  # fmt: skip
        f = self._f
        resolved = pick("layer", layer, f.layers, f.path, negative=True)
        h: Any = slice(None) if head is None else pick("head", head, self.heads, f.path,
                                                           described=f"heads are numbered 1 to {len(self.heads)}") - 1
        if isinstance(sample, str) and sample != "mean":
            raise ArgumentValueError(f"sample must be an index, 'mean' or None (every sample), not {sample!r}")
        if sample is not None and not isinstance(sample, str):
            if f.is_summary:  # an index of the right kind, but a summary keeps no sample's matrices
                raise f.not_per_sample(f"sample {whole('sample', sample, 'a summary takes mean or None')}")
            sample = pick("sample", sample, self.samples, f.path)
        if f.is_summary:
            return self._each_step(lambda b: b.summary_map(datasets.map_name(kind), resolved)[h], step)
        s: Any = sample if isinstance(sample, int) else slice(None)

        def read(b: BiasFile) -> np.ndarray:
            cells = np.asarray(b.dataset(kind, resolved)[s, h], dtype=np.float32)
            return cells.mean(axis=0, dtype=np.float64) if sample == "mean" else cells  # float64: no drift over N

        return self._each_step(read, step)


def _check_name(name: Any, path: Path) -> None:
    """``view[NAME]`` takes a dataset's name: an index (``view[0]``) says what to use instead."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"view[...] takes a dataset name such as 'layer_0/bias' (view.keys() lists those of "
                                f"{path}), not {name!r} ({type(name).__name__}); a layer's matrices are "
                                "view.bias(layer=...), view.weights(layer=...)")  # fmt: skip


def _read(f: BiasFile, layer: int, name: str) -> np.ndarray:
    """One dataset of ``layer`` at ``f``'s checkpoint, through the reader, checked as the table of datasets says."""
    if name in MATRICES:
        return f.read(name, layer)
    if name in ROWS:
        return f.summary_array(name, layer)
    raise BiasvizError(f"{fmt.layer_group(layer)}/{name} of {f.path} is not a dataset biasviz reads")


__all__ = ["FileView"]
