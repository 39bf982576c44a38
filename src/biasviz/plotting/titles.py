"""What a figure's title says of the data it draws: which input, and how the model was trained.

A reader of a figure cannot tell one sample from a mean, or a tiny run from a trained GPT-2; the title says so,
read from the file (whose attributes are data from elsewhere: checked, never trusted).
"""

from __future__ import annotations

from typing import Any

from biasviz.plotting.style import literal
from biasviz.store import BiasFile
from biasviz.store.format import BIAS_DIFFERENCE
from biasviz.store.h5io import json_attr


def which_sample(bf: BiasFile, kind: str, sample: int) -> str:
    """Which input one sample's figure shows, 1-based; a bias stored once says it was measured the same for all."""
    if kind == "bias" and bf.bias_shared and bf.n_samples > 1:
        measured = bf.attrs.get(BIAS_DIFFERENCE) == 0.0
        return f"one bias for all {bf.n_samples} samples" + (" (measured: each equals the first)" if measured else "")
    said = f"sample {sample + 1} of {bf.n_samples}"
    if kind == "bias" and bf.context_dependent and bf.n_samples > 1:
        said += " (the bias depends on the input)"
    return said


def trained_text(bf: BiasFile) -> str | None:
    """:func:`trained_note` of the file, drawn as the characters it holds (None where the file does not say)."""
    note = trained_note(bf.attrs.get("training"))
    return literal(note) if note else None


def trained_suffix(bf: BiasFile) -> str:
    """'; tiny model, 300 training steps on 128-token windows' where the file says how biasviz trained the model."""
    note = trained_text(bf)
    return f"; {note}" if note else ""


def trained_note(value: Any) -> str | None:
    """'tiny model, 300 training steps on 128-token windows' from the ``training`` attribute a file records (JSON
    text, from the checkpoint's training.json; None where it records none, or something else: data, not trusted).

    >>> trained_note('{"preset": "tiny", "steps": 300, "seq_len": 128, "corpus": "stdlib:/usr/lib/python3.11"}')
    'tiny model, 300 training steps on 128-token windows'
    >>> trained_note('{"preset": "tiny", "steps": [0, 100, 300], "seq_len": 128}')
    'tiny model, checkpoints of 0 to 300 training steps on 128-token windows'
    >>> trained_note('not json') is None
    True
    """
    doc = json_attr(value)
    if not isinstance(doc, dict):
        return None
    preset, steps, seq_len = doc.get("preset"), doc.get("steps"), doc.get("seq_len")
    if not (isinstance(preset, str) and isinstance(seq_len, int)) or len(preset) > 40:
        return None
    if isinstance(steps, list) and steps and all(isinstance(x, int) for x in steps):  # a sweep: every checkpoint's
        span = f"{min(steps):,} to {max(steps):,}"
        return f"{preset} model, checkpoints of {span} training steps on {seq_len}-token windows"
    if not isinstance(steps, int) or isinstance(steps, bool):
        return None
    return f"{preset} model, {steps:,} training steps on {seq_len}-token windows"


__all__ = ["trained_note", "trained_suffix", "trained_text", "which_sample"]
