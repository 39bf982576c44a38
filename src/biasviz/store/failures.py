"""HDF5 write failures that Python cannot raise where they happen, caught and raised at the next safe point.

With a full disk or a file-size limit, HDF5 fails some metadata writes while an object is being freed;
h5py prints those as tracebacks and carries on. While a file is written, :class:`DeferredWriteErrors`
records the first such failure instead, as the ``OSError`` it is, and :meth:`check` raises it.

After such a failure the HDF5 library cannot always shut down cleanly: :data:`STATE` remembers it, so
that the command-line entry point can end the process without running the library's exit handlers.
"""

from __future__ import annotations

import sys
from typing import Any

from biasviz.common.errors import underlying_os_error


class _State:
    damaged = False  # an HDF5 write failed while an object was freed: skip the library's exit handlers


STATE = _State()


class DeferredWriteErrors:
    """Install with ``with``; :meth:`check` raises the first write failure HDF5 reported while freeing an object."""

    def __init__(self) -> None:
        self.failure: OSError | None = None
        self._previous: Any = None

    def __enter__(self) -> DeferredWriteErrors:
        # h5py prints such an error through sys.excepthook, then reports it through sys.unraisablehook
        self._previous = (sys.unraisablehook, sys.excepthook)
        sys.unraisablehook, sys.excepthook = self._unraisable, self._excepthook
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None and sys.unraisablehook == self._unraisable:
            sys.unraisablehook, sys.excepthook = self._previous
        self._previous = None

    def _record(self, exc: BaseException | None) -> bool:
        error = underlying_os_error(exc) if isinstance(exc, RuntimeError) else None
        if error is not None:
            STATE.damaged = True
            self.failure = self.failure or error
        return error is not None

    def _unraisable(self, unraisable: Any) -> None:
        if not self._record(unraisable.exc_value):
            self._previous[0](unraisable)

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not self._record(value):
            self._previous[1](kind, value, tb)

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure
