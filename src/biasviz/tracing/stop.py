"""Ending a forward pass early, once everything wanted from it has been recorded.

Extraction of the final layers needs nothing that runs after them (the language-model head, say); a hook or
the trace raises :class:`StopForward` there and the caller swallows it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn


class StopForward(Exception):
    """Raised by a hook to end a forward pass once everything wanted has been captured."""


@contextlib.contextmanager
def stop_after(module: nn.Module | None) -> Iterator[None]:
    """Within the block, a forward pass ends (quietly) as soon as ``module`` has run."""
    if module is None:
        yield
        return

    def _hook(*_: Any) -> None:
        raise StopForward

    handle = module.register_forward_hook(_hook)
    try:
        yield
    except StopForward as stop:
        # the traceback holds every frame of the stopped forward, and with them its activations: let them go
        # now rather than at the next garbage collection (which would double the peak memory of a next pass)
        stop.__traceback__ = None
    finally:
        handle.remove()
