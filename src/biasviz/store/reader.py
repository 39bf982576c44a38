"""Reading format-1 files: validated on opening, arrays read lazily, attributes only ever read as data.

Three layouts read through :class:`BiasFile`: full files (every sample's matrices), full files of a
context-free scheme whose bias is stored once (``bias_shared``: readers see it broadcast over samples)
and summary files (``summary``: block-mean maps, profiles and diagnostics; :mod:`.summary_reader`).
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
from biasviz.store.declared import check_declared
from biasviz.store.format import FORMAT_VERSION, REQUIRED_ATTRS, layer_group
from biasviz.store.guard import check_isolated
from biasviz.store.h5io import in_use
from biasviz.store.summary_reader import SummaryLayout, validate_summary
from biasviz.store.validation import AttrChecks, describe, plain
from biasviz.store.views import OneCheckpoint, SharedSamples


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
        a = self._h5.attrs
        if "biasviz_format" not in a:
            raise BiasvizError(f"{self.path} is an HDF5 file but not a biasviz file (no biasviz_format attribute)")
        try:
            version = self._int_attr("biasviz_format")
        except BiasvizError:
            raise BiasvizError(f"{self.path} has an unreadable biasviz_format attribute") from None
        if version != FORMAT_VERSION:
            raise BiasvizError(
                f"{self.path} is biasviz format {version}; this biasviz reads format {FORMAT_VERSION} (upgrade biasviz)"
            )
        missing = [k for k in REQUIRED_ATTRS if k not in a]
        if missing:
            raise BiasvizError(f"{self.path} lacks required attributes: {', '.join(missing)}")
        self._refuse_other_files_anywhere()
        self._scheme = self._str_attr("scheme")
        self._context_dependent = self._bool_attr("context_dependent")
        self._n_heads = self._int_attr("n_heads", minimum=1)
        self._seq_len = self._int_attr("seq_len", minimum=1)
        self._n_layers = n_layers = self._int_attr("n_layers", minimum=1)
        self.is_summary = self._flag("summary")  # extract --summary: maps, profiles and diagnostics only
        # before anything is read: what the file declares must fit (a small file can declare huge datasets)
        check_declared(self, seq_len=self._seq_len, n_heads=self._n_heads, summary=self.is_summary)
        self._causal = self._bool_attr("causal") if "causal" in a else True
        self.bias_only = self._flag("bias_only")  # extract --bias-only
        self.bias_shared = self._flag("bias_shared") and not self.is_summary  # one bias for every sample
        if self.bias_shared and self._context_dependent:
            raise self._bad("attribute 'bias_shared' says one bias serves every sample, but the scheme is "
                            "context-dependent")  # fmt: skip
        raw = np.asarray(self._read_attr("layers"))
        if raw.ndim > 1 or raw.size == 0 or not np.issubdtype(raw.dtype, np.integer):
            raise self._bad(f"attribute 'layers' should be a list of layer indices, not {describe(raw)}")
        self._layers = [int(x) for x in np.atleast_1d(raw)]
        bad_layers = [x for x in self._layers if not 0 <= x < n_layers]
        if bad_layers or len(set(self._layers)) != len(self._layers):
            raise self._bad(f"attribute 'layers' ({self._layers}) is not a set of indices in 0..{n_layers - 1}")
        self._refuse_other_files("input_ids")
        ids = self._h5.get("input_ids")
        if not isinstance(ids, h5py.Dataset) or ids.ndim != 2 or ids.shape[1] != self._seq_len:
            raise self._bad(f"no (sample, query) dataset 'input_ids' with {self._seq_len} queries")
        if not np.issubdtype(ids.dtype, np.integer):
            raise self._bad(f"'input_ids' holds {ids.dtype}, not integers")
        self._n_samples = int(ids.shape[0])
        self._steps = self._sweep_steps()
        lead = () if self._steps is None else (len(self._steps),)
        self._summary: SummaryLayout | None = None
        if self.is_summary:
            self._summary = validate_summary(self, seq_len=self._seq_len, n_heads=self._n_heads,
                                             n_samples=self._n_samples, layers=self._layers, lead=lead,
                                             bias_only=self.bias_only, causal=self._causal)  # fmt: skip
            return
        matrix = (self._n_heads, self._seq_len, self._seq_len)
        shapes = {"weights": (*lead, self._n_samples, *matrix), "scores": (*lead, self._n_samples, *matrix),
                  "bias": (*lead, 1 if self.bias_shared else self._n_samples, *matrix)}  # fmt: skip
        for layer in self._layers:
            self._refuse_other_files(layer_group(layer))
            grp = self._h5.get(layer_group(layer))
            wanted = "bias" if self.bias_only else "weights"
            if not isinstance(grp, h5py.Group) or not isinstance(grp.get(wanted), h5py.Dataset):
                raise BiasvizError(f"{self.path} lists layer {layer} but has no {layer_group(layer)}/{wanted}")
            for kind, shape in shapes.items():
                if kind not in grp:
                    continue
                self._refuse_other_files(f"{layer_group(layer)}/{kind}")
                ds = grp.get(kind)
                if not isinstance(ds, h5py.Dataset) or ds.shape != shape or ds.dtype.kind != "f":
                    what = f"{ds.dtype} {ds.shape}" if isinstance(ds, h5py.Dataset) else "not a dataset"
                    shared = " (one matrix for all samples: bias_shared)" if shape[len(lead)] != self._n_samples else ""
                    raise self._bad(f"{layer_group(layer)}/{kind} is {what}, expected float {shape}{shared} (from the "
                                    f"attributes n_heads, seq_len and the samples of input_ids)")

    def _sweep_steps(self) -> list[int] | None:
        """The training steps of a sweep file's checkpoints (``/checkpoint``), or None for a plain file."""
        if "checkpoint" not in self._h5:
            return None
        ds = self._h5["checkpoint"]
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.size < 1 or ds.dtype.kind not in "iu":
            raise self._bad("'checkpoint' should be a list of training steps")
        steps = [int(x) for x in ds[()]]
        if not -len(steps) <= self._checkpoint < len(steps):
            raise BiasvizError(f"checkpoint {self._checkpoint} out of range; {self.path} holds {len(steps)} "
                               f"checkpoints (steps {', '.join(map(str, steps))})")  # fmt: skip
        self._checkpoint %= len(steps)
        return steps

    @property
    def checkpoints(self) -> list[int] | None:
        """Training steps of a sweep's checkpoints (``extract --checkpoints``); None for a plain file."""
        return self._steps

    @property
    def step(self) -> int | None:
        """The training step of the checkpoint this reader shows (the last one unless chosen)."""
        return None if self._steps is None else self._steps[self._checkpoint]

    def at_checkpoint(self, index: int) -> BiasFile:
        """The same file showing checkpoint ``index`` of a sweep (shares the open file)."""
        other = object.__new__(BiasFile)
        other.__dict__.update(self.__dict__)
        other._checkpoint = index % len(self._steps) if self._steps else 0
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
        return self._scheme

    @property
    def context_dependent(self) -> bool:
        return self._context_dependent

    @property
    def context_dependence_recorded(self) -> bool | None:
        """:attr:`context_dependent`, or None where the file cannot say (a traced model: ``biasviz diagnose``
        measures it from the data)."""
        known = self._bool_attr("context_dependent_known") if "context_dependent_known" in self._h5.attrs else True
        return self._context_dependent if known else None

    @property
    def layers(self) -> list[int]:
        return list(self._layers)

    @property
    def n_heads(self) -> int:
        return self._n_heads

    @property
    def n_layers(self) -> int:
        """Layers of the source model (the file may hold fewer: see :attr:`layers`)."""
        return self._n_layers

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def causal(self) -> bool:
        """False for bidirectional models, whose cells above the diagonal are used (and stored)."""
        return self._causal

    @property
    def n_samples(self) -> int:
        return self._n_samples

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
        n, b = self._n_samples, self.block
        blocks = f" in blocks of {b} positions" if b and b > 1 else ""
        return BiasvizError(f"{self.path} is a summary file (extract --summary): it holds means and standard "
                            f"deviations over {n} samples{blocks}, not {what}; re-extract without --summary "
                            "to get them")  # fmt: skip

    # -- data ----------------------------------------------------------------------------------
    def dataset(self, kind: str, layer: int = -1) -> h5py.Dataset:
        """The raw (sample, head, query, key) dataset, for reading slices without loading it all.

        A shared bias (``bias_shared``) is seen broadcast over the samples; a summary file has none.
        """
        grp = self._h5[layer_group(self.resolve_layer(layer))]
        if self.is_summary:
            raise self.not_per_sample(f"each sample's {kind} matrices")
        if kind not in grp and kind == "weights":
            raise BiasvizError(f"{self.path} holds the bias only (extracted with --bias-only, no forward pass): "
                               "no attention weights")  # fmt: skip
        if kind not in grp and kind == "scores":
            raise BiasvizError(f"{self.path} holds no scores: extract with --capture bias,weights,scores to store them")
        if kind not in grp:
            raise BiasvizError(f"{self.path} holds no {kind} (scheme '{self.scheme}' adds no bias)")
        ds = grp[kind] if self._steps is None else OneCheckpoint(grp[kind], self._checkpoint)
        return SharedSamples(ds, self._n_samples) if kind == "bias" and self.bias_shared else ds  # type: ignore[return-value]

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
