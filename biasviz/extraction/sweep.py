"""Checkpoint sweeps: how a learned bias evolves over training (``extract --checkpoints``).

``biasviz train --save-every K`` leaves ``OUT/checkpoint-STEP/`` directories, each a complete checkpoint.
A sweep extracts the chosen ones on the same token windows, one after another, and joins them into one
file whose ``bias`` and ``weights`` gain a leading ``checkpoint`` dimension, scaled by the training steps
(:mod:`biasviz.store.combine`). Each slice is exactly the file that checkpoint alone would give.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.common.outputs import check_output_file
from biasviz.training.checkpoints import list_checkpoints


def choose(spec: str, available: dict[int, Path], model_dir: str | Path) -> list[int]:
    """``all``, ``first``, ``last`` or training steps, comma-separated, as sorted steps."""
    if not available:
        raise BiasvizError(f"{model_dir} holds no checkpoint-STEP directories; train it with --save-every K")
    steps = list(available)
    chosen: set[int] = set()
    for item in (x.strip().lower() for x in spec.split(",") if x.strip()):
        if item == "all":
            chosen.update(steps)
        elif item in ("first", "last"):
            chosen.add(steps[0] if item == "first" else steps[-1])
        elif item.isdigit() and int(item) in available:
            chosen.add(int(item))
        else:
            raise UsageError(f"--checkpoints: '{item}' is not all, first, last or one of the steps "
                             f"{', '.join(map(str, steps))}")  # fmt: skip
    if not chosen:
        raise UsageError("--checkpoints is empty; use all, first,last or a list of steps")
    return sorted(chosen)


def extract_sweep(model_dir: str | Path, spec: str, windows: np.ndarray, out: str | Path, *,
                  scheme: str | None = None, force: bool = False, summary: bool = False,
                  **options: Any) -> Any:  # fmt: skip
    """Extract each chosen checkpoint of ``model_dir`` on ``windows`` and join them into ``out``."""
    from biasviz.adapters import load_model
    from biasviz.extraction.run import ExtractResult, extract
    from biasviz.store.combine import combine

    t0 = time.perf_counter()
    out = check_output_file(Path(out), force=force)
    available = list_checkpoints(model_dir)
    steps = choose(spec, available, model_dir)
    if summary:
        return _sweep_summaries(model_dir, available, steps, windows, out, scheme=scheme, force=force, t0=t0,
                                **options)  # fmt: skip
    token = secrets.token_hex(4)
    parts = [out.with_name(f".{out.name}.{token}.step{step}.h5") for step in steps]
    try:
        result, hashes = None, []
        for step, part in zip(steps, parts, strict=True):
            adapter = load_model(available[step], scheme)
            hashes.append(adapter.sha256)
            result = extract(adapter, windows, part, force=True, **options)
        # the file names the run; each checkpoint's parameters keep their own hash, in step order
        attrs = {"source_model": str(Path(model_dir).resolve()), "model_sha256": "per checkpoint: checkpoint_sha256",
                 "checkpoint_sha256": {str(step): h for step, h in zip(steps, hashes, strict=True)}}
        combine(parts, out, along="checkpoint", steps=steps, force=force, attrs=attrs)
    finally:
        for part in parts:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
    assert result is not None
    return ExtractResult(out, result.samples, result.seq_len, result.layers, result.has_bias,
                         time.perf_counter() - t0, out.stat().st_size)  # fmt: skip


def _sweep_summaries(model_dir: str | Path, available: dict[int, Path], steps: list[int], windows: np.ndarray,
                     out: Path, *, scheme: str | None, force: bool, t0: float, dtype: str = "float32",
                     **options: Any) -> Any:  # fmt: skip
    """Summaries of each checkpoint, kept in memory (they are small) and written once with a checkpoint axis."""
    from biasviz.adapters import load_model
    from biasviz.extraction.run import ExtractResult, check_windows
    from biasviz.extraction.summary import summary_run
    from biasviz.store.format import block_size
    from biasviz.store.summary_writer import write_summary_file

    per_step, hashes = [], []
    for step in steps:
        adapter = load_model(available[step], scheme)
        hashes.append(adapter.sha256)
        ids = check_windows(adapter, windows)
        meta, layer_list, summaries, r = summary_run(adapter, ids, **options)
        per_step.append(summaries)
    meta.update({"source_model": str(Path(model_dir).resolve()), "model_sha256": "per checkpoint: checkpoint_sha256",
                 "checkpoint_sha256": {str(step): h for step, h in zip(steps, hashes, strict=True)}})  # fmt: skip
    n, seq_len = ids.shape
    write_summary_file(out, attrs=meta, input_ids=ids, n_heads=adapter.n_heads, seq_len=seq_len, resolution=r,
                       block=block_size(seq_len, r), layers=layer_list, summaries=per_step, checkpoints=steps,
                       causal=bool(adapter.causal), force=force)  # fmt: skip
    return ExtractResult(out, n, seq_len, layer_list, bool(adapter.adds_bias), time.perf_counter() - t0,
                         out.stat().st_size)  # fmt: skip
