"""Diagnostics as a summary file stores them (SPEC section 11): read, never recomputed.

``extract --summary`` computes the diagnostics at full resolution while it still sees every sample, and
stores them with the distance profiles; here they become the same :class:`HeadDiagnostics` that a full
file gives, so that ``diagnose`` and ``plot --kind dynamics`` treat both kinds of file alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from biasviz.diagnostics.measures import HeadDiagnostics

SINK_EPSILON = 0.3  # Gu et al. 2025: a head whose first key takes more than this share of the weight is a sink

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


def stored_position(bias_file: Any, layer: int) -> tuple[list[HeadDiagnostics] | None, dict[str, Any] | None]:
    """SPEC section 12 of a summary, as stored: P's measures per head (None where the file holds no P) and the
    sinks (None where it holds no key profile): each head's share of key 0, and the share of sink heads both
    from the mean and from each sample thresholded alone (Gu et al. 2025, epsilon = 0.3)."""
    summary = getattr(bias_file, "summary", None)
    if summary is None or bias_file.bias_only:
        return None, None
    heads = None
    if summary.holds(layer, "positional_diagnostics"):
        values = bias_file.stored_diagnostics(layer, "positional_diagnostics")
        profile = bias_file.summary_array("positional_profile", layer)[0]
        heads = [HeadDiagnostics(head=h + 1, samples=bias_file.n_samples, context_dependence=None,
                                 toeplitz_residual=_value(values["toeplitz_residual"][h]),
                                 separability_residual=_value(values["separability_residual"][h]),
                                 profile_mean=profile[h], profile_std=np.zeros_like(profile[h]))
                 for h in range(profile.shape[0])]  # fmt: skip
    sinks = None
    if summary.holds(layer, "sink_share"):
        share = bias_file.summary_array("sink_share", layer)  # (N, H)
        first = bias_file.summary_array("weights_key_profile", layer)[0, :, 0]  # (H,) mean weight on key 0
        sinks = {"epsilon": SINK_EPSILON, "share_per_head": [float(x) for x in first],
                 "sink_heads_from_mean": float((first > SINK_EPSILON).mean()),
                 "sink_heads_per_sample": float((share > SINK_EPSILON).mean())}  # fmt: skip
    return heads, sinks


def stored_sweep(bias_file: Any, layer: int) -> list[tuple[int, list[HeadDiagnostics]]]:
    """:func:`stored_heads` at each checkpoint of a summary sweep, by training step."""
    steps = bias_file.checkpoints
    if steps is None:
        raise ValueError("not a sweep file")
    return [(step, stored_heads(bias_file.at_checkpoint(c), layer)) for c, step in enumerate(steps)]


__all__ = ["SINK_EPSILON", "stored_heads", "stored_position", "stored_sweep"]
