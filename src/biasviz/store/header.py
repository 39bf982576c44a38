"""What every format-1 file says of itself before its layers are read: its root attributes, the samples of
``input_ids`` and a sweep's steps (:class:`FileHeader`), each checked for the type and range readers rely on.

Full and summary files share it; their layers are checked by :mod:`.full_layout` and :mod:`.summary_reader`.
"""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.store.declared import check_declared
from biasviz.store.format import FORMAT_VERSION, REQUIRED_ATTRS
from biasviz.store.validation import AttrChecks, describe


@dataclass(frozen=True)
class FileHeader:
    """A file's own account of what it holds, as checked on opening."""

    scheme: str
    context_dependent: bool
    context_known: bool  # False: the file cannot say (a traced model: ``biasviz diagnose`` measures it)
    n_heads: int
    seq_len: int
    n_layers: int  # of the source model; the file may hold fewer (``layers``)
    layers: tuple[int, ...]
    n_samples: int
    causal: bool
    is_summary: bool  # extract --summary: maps, profiles and diagnostics only
    bias_only: bool  # extract --bias-only
    bias_shared: bool  # one bias for every sample (a full file of a context-free scheme)
    steps: tuple[int, ...] | None  # a sweep's training steps (``/checkpoint``); None: a plain file

    @property
    def lead(self) -> tuple[int, ...]:
        """The leading (checkpoint,) axis every layer dataset of a sweep has; () for a plain file."""
        return () if self.steps is None else (len(self.steps),)


def read_header(checks: AttrChecks) -> FileHeader:
    """``checks``' file's header, or one :class:`BiasvizError` naming the first fault. Nothing beyond the root
    attributes, ``input_ids`` and ``checkpoint`` is read; no link to another file is followed, and no dataset whose
    declared size this process could not hold is read later (:func:`~biasviz.store.declared.check_declared`)."""
    a = checks._h5.attrs
    if "biasviz_format" not in a:
        raise BiasvizError(f"{checks.path} is an HDF5 file but not a biasviz file (no biasviz_format attribute)")
    try:
        version = checks._int_attr("biasviz_format")
    except BiasvizError:
        raise BiasvizError(f"{checks.path} has an unreadable biasviz_format attribute") from None
    if version != FORMAT_VERSION:
        raise BiasvizError(
            f"{checks.path} is biasviz format {version}; this biasviz reads format {FORMAT_VERSION} (upgrade biasviz)"
        )
    missing = [k for k in REQUIRED_ATTRS if k not in a]
    if missing:
        raise BiasvizError(f"{checks.path} lacks required attributes: {', '.join(missing)}")
    checks._refuse_other_files_anywhere()
    scheme = checks._str_attr("scheme")
    context_dependent = checks._bool_attr("context_dependent")
    context_known = checks._bool_attr("context_dependent_known") if "context_dependent_known" in a else True
    n_heads = checks._int_attr("n_heads", minimum=1)
    seq_len = checks._int_attr("seq_len", minimum=1)
    n_layers = checks._int_attr("n_layers", minimum=1)
    is_summary = checks._flag("summary")
    # before anything is read: what the file declares must fit (a small file can declare huge datasets)
    check_declared(checks, seq_len=seq_len, n_heads=n_heads, summary=is_summary)
    causal = checks._bool_attr("causal") if "causal" in a else True
    bias_shared = checks._flag("bias_shared") and not is_summary
    if bias_shared and context_dependent:
        raise checks._bad("attribute 'bias_shared' says one bias serves every sample, but the scheme is "
                          "context-dependent")  # fmt: skip
    return FileHeader(scheme=scheme, context_dependent=context_dependent, context_known=context_known,
                      n_heads=n_heads, seq_len=seq_len, n_layers=n_layers, layers=_layers(checks, n_layers),
                      n_samples=_samples(checks, seq_len), causal=causal, is_summary=is_summary,
                      bias_only=checks._flag("bias_only"), bias_shared=bias_shared, steps=_steps(checks))  # fmt: skip


def _layers(checks: AttrChecks, n_layers: int) -> tuple[int, ...]:
    """The ``layers`` attribute: distinct indices of the source model's layers."""
    raw = np.asarray(checks._read_attr("layers"))
    if raw.ndim > 1 or raw.size == 0 or not np.issubdtype(raw.dtype, np.integer):
        raise checks._bad(f"attribute 'layers' should be a list of layer indices, not {describe(raw)}")
    layers = tuple(int(x) for x in np.atleast_1d(raw))
    if any(not 0 <= x < n_layers for x in layers) or len(set(layers)) != len(layers):
        raise checks._bad(f"attribute 'layers' ({list(layers)}) is not a set of indices in 0..{n_layers - 1}")
    return layers


def _samples(checks: AttrChecks, seq_len: int) -> int:
    """The samples ``input_ids`` (sample, query) holds: what every layer dataset's sample axis must be."""
    checks._refuse_other_files("input_ids")
    ids = checks._h5.get("input_ids")
    if not isinstance(ids, h5py.Dataset) or ids.ndim != 2 or ids.shape[1] != seq_len:
        raise checks._bad(f"no (sample, query) dataset 'input_ids' with {seq_len} queries")
    if not np.issubdtype(ids.dtype, np.integer):
        raise checks._bad(f"'input_ids' holds {ids.dtype}, not integers")
    return int(ids.shape[0])


def _steps(checks: AttrChecks) -> tuple[int, ...] | None:
    """The training steps of a sweep file's checkpoints (``/checkpoint``), or None for a plain file."""
    if "checkpoint" not in checks._h5:
        return None
    ds = checks._h5["checkpoint"]
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.size < 1 or ds.dtype.kind not in "iu":
        raise checks._bad("'checkpoint' should be a list of training steps")
    return tuple(int(x) for x in ds[()])


def checkpoint_index(header: FileHeader, checkpoint: int, path: object) -> int:
    """``checkpoint`` (an index, -1 the last) as an index into ``header.steps``; 0 for a plain file."""
    steps = header.steps
    if steps is None:
        return checkpoint
    if not -len(steps) <= checkpoint < len(steps):
        raise BiasvizError(f"checkpoint {checkpoint} out of range; {path} holds {len(steps)} checkpoints (steps "
                           f"{', '.join(map(str, steps))})")  # fmt: skip
    return checkpoint % len(steps)


__all__ = ["FileHeader", "checkpoint_index", "read_header"]
