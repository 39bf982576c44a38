"""Reading format-1 files: validated on opening, arrays read lazily, attributes only ever read as data.

Three layouts read through :class:`BiasFile`: full files (every sample's matrices), full files of a
context-free scheme whose bias is stored once (``bias_shared``: readers see it broadcast over samples)
and summary files (``summary``: block-mean maps, profiles and diagnostics). :class:`BiasFile` opens the file and
answers for it; what the file says of itself is checked by :mod:`.header`, its layers by :mod:`.full_layout` or
:mod:`.summary_reader`, which also read them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import regular_file
from biasviz.store import datasets
from biasviz.store.format import layer_group
from biasviz.store.full_layout import FullLayout, validate_full
from biasviz.store.guard import check_isolated
from biasviz.store.h5io import in_use
from biasviz.store.header import FileHeader, checkpoint_index, read_header
from biasviz.store.summary_reader import SummaryLayout, validate_summary
from biasviz.store.validation import AttrChecks, plain


class BiasFile(AttrChecks):
    """A format-1 file opened for reading; arrays are read lazily, one selection at a time.

    Opening validates everything later reads rely on (attribute types, group and dataset shapes),
    so a damaged or foreign file gives one clear :class:`BiasvizError` here rather than a
    ``KeyError`` deep inside a plot. Attributes are only ever read as data.
    """

    def __init__(self, path: str | Path, checkpoint: int = -1, *, isolated: bool = False) -> None:
        self.path = Path(path)
        self._checkpoint = checkpoint  # in a sweep file, the checkpoint (index) that dataset() and read() show
        if not self.path.exists():
            raise BiasvizError(f"{self.path} does not exist; run 'biasviz extract' first or pass --input")
        if self.path.is_dir():
            raise BiasvizError(f"{self.path} is a folder; give a biasviz .h5 file")
        regular_file(self.path, "biasviz .h5 file")
        if isolated:  # a file from elsewhere: make sure it cannot hang or crash this process when opened
            check_isolated(self.path)
        try:
            self._h5 = h5py.File(self.path, "r")
        except OSError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if in_use(exc):
                raise BiasvizError(f"{self.path} is in use: another process has it open for writing; wait until "
                                   "it is done, then read it") from exc  # fmt: skip
            raise BiasvizError(
                f"{self.path} is not a readable HDF5 file (truncated or another format): {first}"
            ) from exc
        try:
            self._validate()
        except BiasvizError:
            self._h5.close()
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError, IndexError, AttributeError) as exc:
            # HDF5 reports damaged structures with all of these; none of them is a biasviz bug
            self._h5.close()
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BiasvizError(
                f"{self.path} is damaged or not a valid biasviz file ({first}); extract it again"
            ) from exc
        except BaseException:
            self._h5.close()
            raise

    # -- validation ----------------------------------------------------------------------------
    def _validate(self) -> None:
        """The header, then the layers as a summary's or a full file's (:mod:`.summary_reader`, :mod:`.full_layout`)."""
        self._header = h = read_header(self)
        self._checkpoint = checkpoint_index(h, self._checkpoint, self.path)
        self.is_summary, self.bias_only, self.bias_shared = h.is_summary, h.bias_only, h.bias_shared
        self._summary: SummaryLayout | None = None
        self._full: FullLayout | None = None
        if h.is_summary:
            self._summary = validate_summary(self, seq_len=h.seq_len, n_heads=h.n_heads, n_samples=h.n_samples,
                                             layers=list(h.layers), lead=h.lead, bias_only=h.bias_only,
                                             causal=h.causal)  # fmt: skip
        else:
            self._full = validate_full(self, h)

    @property
    def header(self) -> FileHeader:
        """What the file says of itself, as checked on opening."""
        return self._header

    @property
    def checkpoints(self) -> list[int] | None:
        """Training steps of a sweep's checkpoints (``extract --checkpoints``); None for a plain file."""
        steps = self._header.steps
        return None if steps is None else list(steps)

    @property
    def step(self) -> int | None:
        """The training step of the checkpoint this reader shows (the last one unless chosen)."""
        steps = self._header.steps
        return None if steps is None else steps[self._checkpoint]

    def at_checkpoint(self, index: int) -> BiasFile:
        """The same file showing checkpoint ``index`` of a sweep (shares the open file)."""
        other = object.__new__(BiasFile)
        other.__dict__.update(self.__dict__)
        steps = self._header.steps
        other._checkpoint = index % len(steps) if steps else 0
        return other

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
        """Root attributes as plain Python values: data only, nothing is unpickled or evaluated.

        An attribute HDF5 cannot convert (an unusual type, a damaged header) reads as a short note
        instead of failing, so a summary of the rest can still be shown.
        """
        out: dict[str, Any] = {}
        for k in list(self._h5.attrs.keys()):
            try:
                v = self._h5.attrs[k]
            except Exception as exc:  # noqa: BLE001 - any failure to convert is reported as data
                out[k] = f"(unreadable: {type(exc).__name__})"
                continue
            out[k] = plain(v)
        return out

    @property
    def scheme(self) -> str:
        return self._header.scheme

    @property
    def context_dependent(self) -> bool:
        return self._header.context_dependent

    @property
    def context_dependence_recorded(self) -> bool | None:
        """:attr:`context_dependent`, or None where the file cannot say (a traced model: ``biasviz diagnose``
        measures it from the data)."""
        return self._header.context_dependent if self._header.context_known else None

    @property
    def layers(self) -> list[int]:
        return list(self._header.layers)

    @property
    def n_heads(self) -> int:
        return self._header.n_heads

    @property
    def n_layers(self) -> int:
        """Layers of the source model (the file may hold fewer: see :attr:`layers`)."""
        return self._header.n_layers

    @property
    def seq_len(self) -> int:
        return self._header.seq_len

    @property
    def causal(self) -> bool:
        """False for bidirectional models, whose cells above the diagonal are used (and stored)."""
        return self._header.causal

    def layer_causal(self, layer: int = -1) -> bool:
        """Whether ``layer``'s call attends causally (its cells past the query NaN in the bias, 0 in the weights): the
        file's rule (:attr:`causal`), or in a full file the layer's own where the model's calls differ (an
        encoder-decoder's decoder self-attention). A summary layer's own cells are its ``attended`` shares."""
        layer = self.resolve_layer(layer)
        return self.causal if self._full is None else self._full.causal(layer)

    @property
    def n_samples(self) -> int:
        return self._header.n_samples

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
        grp = self._h5[layer_group(self.resolve_layer(layer))]
        return (datasets.map_name("bias") if self.is_summary else "bias") in grp

    def has_positional(self, layer: int = -1) -> bool:
        """Whether a summary holds the positional logits P (docs/positional.md: two samples or more)."""
        grp = self._h5[layer_group(self.resolve_layer(layer))]
        return self.is_summary and datasets.POSITIONAL_MEAN in grp

    def has_scores(self, layer: int = -1) -> bool:
        """Whether the scores are stored (a full file extracted with --capture ...,scores; every summary's maps)."""
        grp = self._h5[layer_group(self.resolve_layer(layer))]
        return (datasets.map_name("scores") if self.is_summary else "scores") in grp

    # -- summary files (docs/hdf5.md, 'Summary files') -------------------------------------------------------
    @property
    def summary(self) -> SummaryLayout | None:
        """The layout of a summary file (``extract --summary``); None for a full file."""
        return self._summary

    @property
    def resolution(self) -> int | None:
        """Blocks per axis at most (``--resolution``) of a summary file; None for a full file."""
        return None if self._summary is None else self._summary.resolution

    @property
    def block(self) -> int | None:
        """Positions per block of a summary file's maps (1: exact per cell); None for a full file."""
        return None if self._summary is None else self._summary.block

    def _layout(self, what: str) -> SummaryLayout:
        if self._summary is None:
            raise BiasvizError(f"{self.path} is a full file, not a summary (extract --summary): it has no {what}")
        return self._summary

    def summary_map(self, name: str, layer: int = -1) -> np.ndarray:
        """``bias_mean``, ``bias_std``, ``weights_mean`` or ``weights_std``: float32 (head, query_block,
        key_block), NaN where a block has no cell (above the diagonal)."""
        return self._layout(name).read_map(name, self.resolve_layer(layer), self._checkpoint)

    def profile(self, kind: str, layer: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """A summary's stored distance profile of ``kind``: (mean, std), each (head, distance), float64."""
        return self._layout(f"{kind} profile").read_profile(kind, self.resolve_layer(layer), self._checkpoint)

    def summary_array(self, name: str, layer: int = -1) -> np.ndarray:
        """Any dataset of a summary layer, by its name in the table of datasets (:data:`biasviz.store.datasets.ROWS`),
        checked as its row says: docs/positional.md's ``positional_profile`` (from_key, head, distance),
        ``weights_key_profile`` (stat, head, key) and ``sink_share`` (sample, head), docs/position-measures.md's
        ``band_mass``, ``context_mass``, ``weights_entropy``, ``sink_keys`` and the ``_se`` beside each mean, ... as
        float64 (``sink_keys`` and the diagnostics as their records); a block map as :meth:`summary_map` reads it."""
        if name not in datasets.ROWS:
            raise ValueError(f"not a dataset of a summary layer: {name!r} (one of {', '.join(datasets.ROWS)})")
        layout, resolved = self._layout(name.replace("_", " ")), self.resolve_layer(layer)
        if name in datasets.SUMMARY_MAPS:
            return layout.read_map(name, resolved, self._checkpoint)
        return layout.read_row(name, resolved, self._checkpoint)

    def stored_diagnostics(self, layer: int = -1, name: str = datasets.DIAGNOSTICS) -> dict[str, np.ndarray]:
        """A summary's diagnostics, computed at extraction at full resolution: field -> (head,), NaN if undefined.
        ``name``: ``diagnostics`` (the bias) or ``positional_diagnostics`` (the positional logits P)."""
        return self._layout("stored diagnostics").read_diagnostics(self.resolve_layer(layer), self._checkpoint, name)

    def summary_datasets(self, layer: int = -1) -> tuple[str, ...]:
        """The names of the summary datasets a layer holds."""
        return self._layout("summary datasets").contents[self.resolve_layer(layer)]

    def not_per_sample(self, what: str) -> BiasvizError:
        """The error for a request that needs per-sample matrices of a summary file."""
        n, b = self._header.n_samples, self.block
        blocks = f" in blocks of {b} positions" if b and b > 1 else ""
        return BiasvizError(f"{self.path} is a summary file (extract --summary): it holds means and standard "
                            f"deviations over {n} samples{blocks}, not {what}; re-extract without --summary "
                            "to get them")  # fmt: skip

    # -- data ----------------------------------------------------------------------------------
    def dataset(self, kind: str, layer: int = -1) -> h5py.Dataset:
        """The raw (sample, head, query, key) dataset, for reading slices without loading it all.

        A shared bias (``bias_shared``) is seen broadcast over the samples; a summary file has none.
        """
        if self._full is None:
            raise self.not_per_sample(f"each sample's {kind} matrices")
        return self._full.dataset(kind, self.resolve_layer(layer), self._checkpoint)  # type: ignore[return-value]

    def read(self, kind: str, layer: int = -1, sample: int | slice | None = None) -> np.ndarray:
        """``kind`` ('bias', 'weights' or 'scores') as float32: (sample, head, query, key), or
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


def open_bias_file(path: str | Path, checkpoint: int = -1, *, isolated: bool = False) -> BiasFile:
    """Open and validate a format-1 file; clear errors for anything else.

    In a sweep file, ``checkpoint`` (an index, -1 the last) is the checkpoint its datasets show.
    ``isolated``: open and validate it in a child process first, with a time limit (:mod:`.guard`).
    """
    return BiasFile(path, checkpoint, isolated=isolated)


def _check_file(path: str) -> int:
    """The child of :func:`biasviz.store.guard.check_isolated`: exit 0 when ``path`` opens and validates."""
    try:
        BiasFile(path).close()
    except BiasvizError as exc:
        print(exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_check_file(sys.argv[1]))
