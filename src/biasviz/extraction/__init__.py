"""A run from token windows to a file: the model's bias and weights captured, reduced or stored.

:mod:`.run` is one process; :mod:`.distributed` splits samples across torchrun ranks; :mod:`.sweep` goes over a
checkpoint series (a folder's, or revisions in the hub cache, :mod:`.hub`), resumably (:mod:`.resume`);
:mod:`.api` is ``biasviz.extract`` for any model or path; :mod:`.tokens` picks the tokenizer.
"""

from typing import Any

# the names ``biasviz.extraction`` held when it was one module, imported on first use (torch comes with them)
_LAZY = {"extract": "run", "ExtractResult": "run", "provenance": "run", "extract_bias_only": "bias_only",
         "extract_summary": "summary"}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"biasviz.extraction.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'biasviz.extraction' has no attribute {name!r}")
