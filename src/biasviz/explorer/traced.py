"""A trace explored with no file of the user's: ``biasviz.explore(t)`` for ``with biasviz.trace(model) as t``.

The trace's recorded calls go into a format-1 file in a temporary folder, the page is built from it exactly as
from a file ``biasviz.extract`` writes, and the folder is removed: what the page shows went through the same
reader and checks as every file.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.errors import BiasvizError


def is_trace(value: object) -> bool:
    """True for a :class:`biasviz.tracing.Trace` (checked without importing torch for a path)."""
    import sys

    mode = sys.modules.get("biasviz.tracing.mode")
    return mode is not None and isinstance(value, mode.Trace)


def _layers(trace: Any, layer: int | None) -> list[int]:
    """The calls to show: ``layer`` (an index into the recorded calls; -1 the last), else every recorded call of
    the last one's shape (a page shows heads of one size; cross-attention and other shapes are left out)."""
    weights = trace.weights
    if not weights:
        notes = "; ".join(f"call {k}: {v}" for k, v in sorted(trace.notes.items()))
        raise BiasvizError("the trace recorded no attention weights" + (f" ({notes})" if notes else "")
                           + ": run the model inside 'with biasviz.trace(model) as t:' first")  # fmt: skip
    recorded = sorted(weights)
    if layer is not None:
        if layer not in recorded and not -len(recorded) <= layer < 0:
            raise BiasvizError(f"the trace recorded calls {', '.join(map(str, recorded))}; layer {layer} is none "
                               "of them (-1 is the last)")  # fmt: skip
        chosen = [layer if layer >= 0 else recorded[layer]]
    else:
        shape = tuple(weights[recorded[-1]].shape)
        chosen = [k for k in recorded if tuple(weights[k].shape) == shape]
    b, _, tq, tk = weights[chosen[0]].shape
    if tq != tk:
        raise BiasvizError(f"call {chosen[0]} has {tq} queries and {tk} keys; the explorer shows square "
                           "(query, key) matrices (self-attention)")  # fmt: skip
    return chosen


def _as_numpy(tensor: Any) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


@contextlib.contextmanager
def trace_file(trace: Any, *, layer: int | None = None, input_ids: Any = None,
               tokenizer: str | Path | None = None) -> Iterator[Path]:  # fmt: skip
    """A temporary format-1 file of the trace's calls (removed when the block ends).

    ``input_ids`` (batch, T), when given, are stored for the read-out's tokens (with ``tokenizer``); otherwise the
    file holds -1 for every id, as a ``--bias-only`` file does.
    """
    from biasviz.common.version import __version__
    from biasviz.store import BiasFileWriter

    layers = _layers(trace, layer)
    weights = {k: _as_numpy(trace.weights[k]) for k in layers}
    n, heads, t, _ = weights[layers[0]].shape
    biases = trace.bias
    has_bias = all(k in biases for k in layers)
    bias = {k: _as_numpy(biases[k]) for k in layers} if has_bias else None
    above = ~np.tril(np.ones((t, t), dtype=bool))
    # each call's rule as its cells say (an encoder-decoder's decoder self-attention is causal, its others are not)
    rules = {k: not weights[k][..., above].any() and (bias is None or bool(np.isnan(bias[k][..., above]).all()))
             for k in layers}  # fmt: skip
    causal = all(rules.values())
    if input_ids is None:
        ids = np.full((n, t), -1, np.int32)
    else:
        ids = np.asarray(input_ids.detach().cpu() if hasattr(input_ids, "detach") else input_ids)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.shape != (n, t):
            raise BiasvizError(f"input_ids are {tuple(ids.shape)}; the traced calls saw ({n}, {t}) (batch, tokens)")
        ids = ids.astype(np.int32)
    import torch

    model = trace.model
    if model is not None:
        from biasviz.adapters.traced import module_sha256

        sha, architecture = module_sha256(model), type(model).__name__
    else:
        sha, architecture = "0" * 64, "unknown"
    attrs = {"scheme": "captured", "context_dependent": bool(bias) and any(b.shape[0] > 1 for b in bias.values()),
             "source_model": f"biasviz.trace of {architecture}", "model_sha256": sha, "architecture": architecture,
             "n_layers": len(trace.calls), "seed": -1, "text_source": "the traced forward" if input_ids is not None
             else "the traced forward (token ids not given)", "device": str(next(iter(trace.weights.values())).device),
             "biasviz_version": __version__, "torch_version": torch.__version__}  # fmt: skip
    if tokenizer is not None:
        attrs["tokenizer"] = str(tokenizer)
    with tempfile.TemporaryDirectory(prefix="biasviz-trace-") as folder:
        path = Path(folder) / "trace.h5"
        with BiasFileWriter(path, attrs=attrs, n_samples=n, n_heads=heads, seq_len=t, layers=layers,
                            has_bias=has_bias, causal=causal, layer_causal=rules, workers=1) as writer:  # fmt: skip
            writer.write_batch(ids, weights=weights, bias=bias)
        yield path
