"""biasviz: extract, store and plot the positional attention biases of transformer models.

How the code is organised - one package per stage, listed from the bottom up; a package imports only from
those above it in this list (``tests/project/test_layout.py`` holds the order and checks every import):

- ``common``: what every stage uses - errors, files written atomically, input and output checks, devices,
  memory estimates, torchrun processes, hashing, the version.
- ``schemes``: the bias math of every scheme (ALiBi, KERPLE, FIRE, T5, CABLE, FoX, ...) and their registry.
- ``model``: our GPT-2 variants, with named hook points at every attention's bias and weights.
- ``data``: the built-in corpus, the local tokenizer, and token windows.
- ``training``: ``biasviz train`` and the checkpoint folders it writes.
- ``store``: the HDF5 format - its layout, writer, reader, combining shards, compression on CPU and GPU.
- ``diagnostics``: the context-dependence, Toeplitz and separability measures (docs/diagnostics.md).
- ``tracing``: ``biasviz.trace`` - any model's attention calls (SDPA, flex, torch layers, eager), formed explicitly.
- ``adapters``: open any checkpoint (ours, nanoGPT, transformers, user code) and capture bias and weights.
- ``summaries``: means, spreads, profiles and diagnostics reduced while the model runs (docs/hdf5.md, 'Summary files').
- ``extraction``: a run from windows to a file - one process, torchrun, checkpoint sweeps, the Python API.
- ``plotting``, ``explorer``: figures and the interactive page, read from the files.
- ``notebook``: ``biasviz.open`` and ``biasviz.plot`` - files and the command's figures in Python.
- ``cli``: the ``biasviz`` command.

``biasviz.trace(model)``, ``biasviz.extract(model_or_path, input_ids, out)`` and ``biasviz.explore(...)`` are
the Python API; they import torch on first use, so ``import biasviz`` (and the CLI's ``--help``) stays light.
``biasviz.open(path)`` reads a file read-only, labelled (``.bias(...)``, ``["layer_3/bias_mean"]``,
``.to_xarray()``, ``.plot(kind=...)``, ``.explore()``), and ``biasviz.plot(path, kind=...)`` returns the figure
``biasviz plot`` saves; neither imports torch.
"""

from typing import Any

from biasviz.common.version import __version__

_LAZY = {"trace": "biasviz.tracing", "extract": "biasviz.extraction.api", "explore": "biasviz.explorer",
         "open": "biasviz.notebook", "plot": "biasviz.notebook"}


def __getattr__(name: str) -> Any:
    """The Python API, imported on first use so that ``import biasviz`` (and the CLI) stays fast."""
    if name in _LAZY:
        import importlib
        import warnings

        with warnings.catch_warnings():
            # transformers imports tqdm.auto, which in a Jupyter kernel without ipywidgets warns that its notebook
            # bars are missing: biasviz draws none there (progress goes to stderr as lines, or nowhere)
            warnings.filterwarnings("ignore", message="IProgress not found")
            module = importlib.import_module(_LAZY[name])
        return getattr(module, name)
    raise AttributeError(f"module 'biasviz' has no attribute {name!r}")


# (``open`` is left out of ``import *``, where it would hide Python's own ``open``)
__all__ = ["__version__", "explore", "extract", "plot", "trace"]
