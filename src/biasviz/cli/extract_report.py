"""What ``biasviz extract`` says once its file is in place: one ``wrote ...`` line, and notes on what is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def report(request: Any, adapter: Any, result: Any, w: Any, series: Any) -> None:
    """The ``wrote PATH: ...`` line of a finished extract (``request``: its :class:`ExtractRequest`)."""
    if request.bias_only:
        if request.resolution is not None:
            shape = blocks(request.seq_len, request.resolution)
        else:
            shape = f"{request.seq_len} x {request.seq_len}, {request.dtype}"
        which = f"layer{'s' * (len(result.layers) > 1)} {', '.join(map(str, result.layers))}"
        click.echo(f"wrote {result.path}: the bias of {which}, "
                   f"{adapter.n_heads} heads x {shape}, no text (--bias-only), "
                   f"{result.bytes / 1e6:.1f} MB in {result.seconds:.1f} s")  # fmt: skip
        return
    kinds = request.kinds
    if request.summary:
        stored = summarised(result.path, result.layers[0], adapter.scheme)
        if result.samples < 2 and "positional" not in stored:
            click.echo("note: no positional logits P: P needs two samples or more (it pairs the queries of one "
                       "text with the keys of another, docs/positional.md); run with --samples 2 or more",
                       err=True)  # fmt: skip
    else:
        stored = listed([k for k in kinds or ("bias", "weights") if k != "bias" or result.has_bias],
                        adapter.scheme, result.has_bias or bool(kinds and "bias" not in kinds))  # fmt: skip
    names = ", ".join(str(x) for x in result.layers)
    names = f"layer {names}" if len(result.layers) == 1 else f"layers {names}:"  # not "layer 0, 11 bias"
    where = f", {w.size} processes" if w.size > 1 else ""
    if series is not None:
        steps = [str(c.step) for c in series.chosen]
        shown = ", ".join(steps if len(steps) <= 8 else [*steps[:4], "...", *steps[-3:]])
        where += f", {len(steps)} checkpoints (steps {shown})"
    samples = f"{result.samples} sample{'s' * (result.samples != 1)}"
    if request.summary:
        maps = blocks(result.seq_len, request.resolution)
        shape = f"summary of {samples}: {adapter.n_heads} heads x {maps}"
    else:
        shape = f"{samples} x {adapter.n_heads} heads x {result.seq_len} x {result.seq_len}"
    click.echo(
        f"wrote {result.path}: {shape}, {names} {stored}, {'float32' if request.summary else request.dtype}"
        f"{where}, {result.bytes / 1e6:.1f} MB in {result.seconds:.1f} s"
    )


def blocks(seq_len: int, resolution: int | None) -> str:
    """``1024 x 1024 blocks of 16 positions`` (or ``512 x 512 cells``) for the summary of ``seq_len`` positions."""
    from biasviz.store.format import DEFAULT_RESOLUTION, block_size

    b = block_size(seq_len, min(DEFAULT_RESOLUTION, seq_len) if resolution is None else resolution)
    nb = -(-seq_len // b)
    return f"{nb} x {nb} cells" if b == 1 else f"{nb} x {nb} blocks of {b} positions"


def summarised(path: Path, layer: int, scheme: str) -> str:
    """What a summary file holds, as read back from it: bias, weights, scores, positional logits."""
    import h5py

    from biasviz.store.datasets import BAND_MASS, FREQUENCY_USE, POSITIONAL_FREQUENCY, POSITIONAL_MEAN, map_name

    with h5py.File(path, "r") as f:
        names = set(f[f"layer_{layer}"])
    held = [label for label, key in (("bias", map_name("bias")), ("weights", map_name("weights")),
                                     ("scores", map_name("scores")), ("positional logits", POSITIONAL_MEAN),
                                     ("position measures", BAND_MASS), ("rotary frequencies", FREQUENCY_USE))
            if key in names]  # fmt: skip
    if BAND_MASS in names and FREQUENCY_USE not in names:
        click.echo("note: no rotary frequency measures (docs/position-measures.md): no rotary module was found in "
                   "the model", err=True)  # fmt: skip
    elif FREQUENCY_USE in names and POSITIONAL_FREQUENCY not in names:
        click.echo(f"note: no {POSITIONAL_FREQUENCY}: it needs two samples, the model's rows formed again and a mask "
                   "that is a rule of distance", err=True)  # fmt: skip
    return listed(held, scheme, "bias" in held)


def listed(held: list[str], scheme: str, adds_bias: bool) -> str:
    """'bias, weights and scores'; where the model adds no bias, it says so."""
    text = ", ".join(held[:-1]) + f" and {held[-1]}" if len(held) > 1 else "".join(held)
    return text if adds_bias else f"{text} (scheme '{scheme}' adds no bias)"
