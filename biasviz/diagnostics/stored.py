"""Diagnostics as a summary file stores them (SPEC section 11): read, never recomputed.

``extract --summary`` computes the diagnostics at full resolution while it still sees every sample, and
stores them with the distance profiles; here they become the same :class:`HeadDiagnostics` that a full
file gives, so that ``diagnose`` and ``plot --kind dynamics`` treat both kinds of file alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from biasviz.diagnostics.measures import HeadDiagnostics

UNDEFINED = {
    "context_dependence": "context dependence is not defined (it needs at least 2 samples)",
    "toeplitz_residual": "Toeplitz residual is not defined (the mean bias is constant)",
    "separability_residual": "separability residual is not defined (the mean bias is constant)",
}


def _value(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def stored_heads(bias_file: Any, layer: int) -> list[HeadDiagnostics]:
    """Per head, the stored diagnostics and bias profile of a summary file (its current checkpoint)."""
    values = bias_file.stored_diagnostics(layer)
    mean, std = bias_file.profile("bias", layer)
    heads = []
    for h in range(mean.shape[0]):
        notes = [f"head {h + 1}: {text}" for key, text in UNDEFINED.items() if np.isnan(values[key][h])]
        heads.append(HeadDiagnostics(head=h + 1, samples=bias_file.n_samples,
                                     context_dependence=_value(values["context_dependence"][h]),
                                     toeplitz_residual=_value(values["toeplitz_residual"][h]),
                                     separability_residual=_value(values["separability_residual"][h]),
                                     profile_mean=mean[h], profile_std=std[h], notes=notes))  # fmt: skip
    return heads


def stored_sweep(bias_file: Any, layer: int) -> list[tuple[int, list[HeadDiagnostics]]]:
    """:func:`stored_heads` at each checkpoint of a summary sweep, by training step."""
    steps = bias_file.checkpoints
    if steps is None:
        raise ValueError("not a sweep file")
    return [(step, stored_heads(bias_file.at_checkpoint(c), layer)) for c, step in enumerate(steps)]


__all__ = ["stored_heads", "stored_sweep"]
