"""Reading format-1 files: validated on opening, arrays read lazily, attributes only ever read as data."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import regular_file
from biasviz.store.format import FORMAT_VERSION, REQUIRED_ATTRS, layer_group
from biasviz.store.guard import check_isolated


class BiasFile:
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
    def _bad(self, what: str) -> BiasvizError:
        return BiasvizError(f"{self.path} is not a valid biasviz file: {what}; extract it again")

    def _read_attr(self, key: str) -> Any:
        try:
            value = self._h5.attrs[key]
        except Exception as exc:  # an attribute of a type HDF5 cannot convert, or a damaged header
            raise self._bad(f"attribute '{key}' cannot be read ({type(exc).__name__})") from exc
        return _plain(value) if isinstance(value, (bytes, str)) else value

    def _int_attr(self, key: str, minimum: int | None = None) -> int:
        value = self._read_attr(key)
        arr = np.asarray(value)
        if arr.size != 1 or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
            raise self._bad(f"attribute '{key}' should be an integer, not {_describe(value)}")
        number = int(arr.reshape(()).item())
        if minimum is not None and number < minimum:
            raise self._bad(f"attribute '{key}' is {number}, expected at least {minimum}")
        return number

    def _str_attr(self, key: str) -> str:
        value = self._read_attr(key)
        if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "OSU":
            value = value.reshape(()).item()
            value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if not isinstance(value, str):
            raise self._bad(f"attribute '{key}' should be text, not {_describe(value)}")
        return value

    def _bool_attr(self, key: str) -> bool:
        arr = np.asarray(self._read_attr(key))
        if arr.size != 1 or not (np.issubdtype(arr.dtype, np.bool_) or np.issubdtype(arr.dtype, np.integer)):
            raise self._bad(f"attribute '{key}' should be true or false, not {_describe(arr)}")
        return bool(arr.reshape(()).item())

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
        self._scheme = self._str_attr("scheme")
        self._context_dependent = self._bool_attr("context_dependent")
        self._n_heads = self._int_attr("n_heads", minimum=1)
        self._seq_len = self._int_attr("seq_len", minimum=1)
        self._n_layers = n_layers = self._int_attr("n_layers", minimum=1)
        self._causal = self._bool_attr("causal") if "causal" in a else True
        self.bias_only = self._bool_attr("bias_only") if "bias_only" in a else False  # extract --bias-only
        raw = np.asarray(self._read_attr("layers"))
        if raw.ndim > 1 or raw.size == 0 or not np.issubdtype(raw.dtype, np.integer):
            raise self._bad(f"attribute 'layers' should be a list of layer indices, not {_describe(raw)}")
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
        shape = (*lead, self._n_samples, self._n_heads, self._seq_len, self._seq_len)
        for layer in self._layers:
            self._refuse_other_files(layer_group(layer))
            grp = self._h5.get(layer_group(layer))
            wanted = "bias" if self.bias_only else "weights"
            if not isinstance(grp, h5py.Group) or not isinstance(grp.get(wanted), h5py.Dataset):
                raise BiasvizError(f"{self.path} lists layer {layer} but has no {layer_group(layer)}/{wanted}")
            for kind in ("bias", "weights"):
                if kind not in grp:
                    continue
                self._refuse_other_files(f"{layer_group(layer)}/{kind}")
                ds = grp.get(kind)
                if not isinstance(ds, h5py.Dataset) or ds.shape != shape or ds.dtype.kind != "f":
                    what = f"{ds.dtype} {ds.shape}" if isinstance(ds, h5py.Dataset) else "not a dataset"
                    raise self._bad(f"{layer_group(layer)}/{kind} is {what}, expected float {shape}")

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

    def _refuse_other_files(self, name: str) -> None:
        """``name`` must live in this file: an external link, external storage or a virtual dataset would make
        HDF5 read other files (a FIFO there blocks the reader forever)."""
        link = self._h5.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            raise self._bad(f"'{name}' is an external link to another file ({_short_text(link.filename)})")
        obj = self._h5.get(name) if link is not None else None
        if isinstance(obj, h5py.Dataset) and (obj.is_virtual or obj.external):
            raise self._bad(f"'{name}' keeps its data in another file (external or virtual storage)")

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
            out[k] = _plain(v)
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
        known = self._h5.attrs.get("context_dependent_known", True)
        return self._context_dependent if bool(np.asarray(known).reshape(-1)[0]) else None

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
        return "bias" in self._h5[layer_group(self.resolve_layer(layer))]

    # -- data ----------------------------------------------------------------------------------
    def dataset(self, kind: str, layer: int = -1) -> h5py.Dataset:
        """The raw (sample, head, query, key) dataset, for reading slices without loading it all."""
        grp = self._h5[layer_group(self.resolve_layer(layer))]
        if kind not in grp and kind == "weights":
            raise BiasvizError(f"{self.path} holds the bias only (extracted with --bias-only, no forward pass): "
                               "no attention weights")  # fmt: skip
        if kind not in grp:
            raise BiasvizError(f"{self.path} holds no {kind} (scheme '{self.scheme}' adds no bias)")
        return grp[kind] if self._steps is None else _OneCheckpoint(grp[kind], self._checkpoint)

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


class _OneCheckpoint:
    """A sweep dataset (checkpoint, sample, head, query, key) seen at one checkpoint, as a plain file's is."""

    def __init__(self, ds: h5py.Dataset, index: int) -> None:
        self._ds, self._index = ds, index
        self.shape, self.ndim, self.dtype = ds.shape[1:], ds.ndim - 1, ds.dtype
        self.chunks = None if ds.chunks is None else ds.chunks[1:]

    def __getitem__(self, sel: Any) -> Any:
        return self._ds[(self._index, *(sel if isinstance(sel, tuple) else (sel,)))]

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name: str) -> Any:  # compression, shuffle, attrs, ...: the dataset's own
        return getattr(self._ds, name)


def _text(value: str) -> str:
    """Text that can be printed: undecodable bytes (h5py keeps them as lone surrogates) become escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _plain(value: Any) -> Any:
    """An attribute value as plain Python data (text, numbers, lists); bytes are decoded, never unpickled."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [_plain(x) for x in value.tolist()] if value.dtype.kind in "OSV" else value.tolist()
    if isinstance(value, np.void):
        return _plain(value.item())
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, (tuple, list)):
        return [_plain(x) for x in value]
    return value


def _short_text(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _describe(value: Any) -> str:
    """A short description of an attribute value for error messages (never its full, possibly huge, text)."""
    arr = np.asarray(value) if not isinstance(value, str) else None
    if arr is None:
        return f"text '{value[:40]}'" + ("..." if len(value) > 40 else "")
    return f"{arr.dtype} of shape {arr.shape}" if arr.ndim else f"{arr.dtype} {str(arr.item())[:40]!r}"


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
