"""The user's own model code: ``--model path/to/code.py:FACTORY`` builds any ``torch.nn.Module``, traced.

The code is the user's, named by the user, so it runs as their own code would; whatever it raises becomes one
error that says where it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from biasviz.adapters.traced import TracedAdapter
from biasviz.common.errors import BiasvizError
from biasviz.common.out_of_memory import ran_out


def is_factory_spec(spec: str | Path) -> bool:
    """Whether ``--model`` names Python code and a factory in it (``code.py:FACTORY``)."""
    text = str(spec)
    path, sep, name = text.rpartition(":")
    return bool(sep) and path.endswith(".py") and name.isidentifier()


@contextlib.contextmanager
def users_code(spec: str, what: str) -> Iterator[None]:
    """Within the block the user's code runs: whatever it raises, or a ``sys.exit`` in it, becomes one error
    that says where it came from (``--debug`` shows the traceback). biasviz's own signals pass through, and so does
    memory that ran out (:mod:`biasviz.common.out_of_memory`)."""
    from biasviz.tracing.stop import StopForward

    try:
        yield
    except (BiasvizError, StopForward):
        raise
    except SystemExit as exc:
        raise BiasvizError(f"--model {spec}: {what} called sys.exit({exc.code!r}); the exit came from your code "
                           "(biasviz --debug shows the traceback)") from exc  # fmt: skip
    except Exception as exc:
        if ran_out(exc) is not None:  # memory that ran out is no fault of the code: said as such where it is caught
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise BiasvizError(f"--model {spec}: {what} failed: {type(exc).__name__}{': ' + first if first else ''}; "
                           "the error came from your code (biasviz --debug shows the traceback)") from exc  # fmt: skip


def load_factory(spec: str, checkpoint: str | None = None, scheme: str | None = None) -> TracedAdapter:
    """Import the user's ``code.py`` (named by the user, so run as their own code) and build the model:
    ``FACTORY()`` or, with a checkpoint, ``FACTORY(checkpoint)``. Import, factory and every forward of the
    model run inside :func:`users_code`."""
    path_text, _, name = str(spec).rpartition(":")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise BiasvizError(f"--model {spec}: {path} is not a file")
    module_name = "biasviz_user_model_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    where = str(path.resolve().parent)
    sys.path.insert(0, where)  # so that the code's own imports of its neighbours work, as when run from there
    try:
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise BiasvizError(f"--model {spec}: cannot import {path} as Python code")
        code = importlib.util.module_from_spec(loader)
        # registered while it runs, as an import does: dataclasses, typing and pickle look a class's module up there
        sys.modules[module_name] = code
        try:
            with users_code(spec, f"importing {path.name}"):
                loader.loader.exec_module(code)
        except BaseException:
            sys.modules.pop(module_name, None)  # a failed import leaves nothing behind, as importlib's own
            raise
        factory = getattr(code, name, None)
        if not callable(factory):
            raise BiasvizError(f"--model {spec}: {path.name} defines no callable '{name}'")
        with users_code(spec, f"{name}({'checkpoint' if checkpoint else ''})"):
            model = factory(checkpoint) if checkpoint is not None else factory()
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(where)
    if not isinstance(model, nn.Module):
        raise BiasvizError(f"--model {spec}: {name}() returned a {type(model).__name__}, not a torch.nn.Module")
    source = f"{path.resolve()}:{name}" + (f" ({Path(checkpoint).expanduser().resolve()})" if checkpoint else "")
    sha = ""
    if checkpoint is not None and Path(checkpoint).expanduser().is_file():
        from biasviz.common.hashing import sha256_file

        sha = sha256_file(Path(checkpoint).expanduser())
    from biasviz.adapters import check_finite

    def forward(ids: torch.Tensor) -> Any:
        with users_code(spec, "the model's forward"):
            return model(ids)

    adapter = TracedAdapter(model.eval(), forward=forward, scheme=scheme, source=source, sha256=sha)
    check_finite(adapter)
    return adapter
