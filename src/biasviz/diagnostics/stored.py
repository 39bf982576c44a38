"""Diagnostics as a summary file stores them (docs/hdf5.md, 'Summary files'): read, never recomputed.

``extract --summary`` computes the diagnostics at full resolution while it still sees every sample, and
stores them with the distance profiles; here they become the same :class:`HeadDiagnostics` that a full
file gives, so that ``diagnose`` and ``plot --kind dynamics`` treat both kinds of file alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from biasviz.diagnostics.measures import HeadDiagnostics
from biasviz.store.datasets import (
    DISTANCE_BINS,
    KEY_PROFILE,
    POSITIONAL_DIAGNOSTICS,
    POSITIONAL_PROFILE,
    SINK_KEYS,
    SINK_KEYS_OF_MEAN,
    SINK_SHARE,
    se_name,
)

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
    """docs/positional.md of a summary, as stored: P's measures per head (None where the file holds no P) and the
    sinks (None where it holds no key profile): each head's share of key 0, and the share of sink heads both
    from the mean and from each sample thresholded alone (Gu et al. 2025, epsilon = 0.3)."""
    summary = getattr(bias_file, "summary", None)
    if summary is None or bias_file.bias_only:
        return None, None
    heads = None
    if summary.holds(layer, POSITIONAL_DIAGNOSTICS):
        values = bias_file.stored_diagnostics(layer, POSITIONAL_DIAGNOSTICS)
        profile = bias_file.summary_array(POSITIONAL_PROFILE, layer)[0]
        heads = [HeadDiagnostics(head=h + 1, samples=bias_file.n_samples, context_dependence=None,
                                 toeplitz_residual=_value(values["toeplitz_residual"][h]),
                                 separability_residual=_value(values["separability_residual"][h]),
                                 profile_mean=profile[h], profile_std=np.zeros_like(profile[h]))
                 for h in range(profile.shape[0])]  # fmt: skip
    sinks = None
    if summary.holds(layer, SINK_SHARE):
        share = bias_file.summary_array(SINK_SHARE, layer)  # (N, H)
        first = bias_file.summary_array(KEY_PROFILE, layer)[0, :, 0]  # (H,) mean weight on key 0
        sinks = {"epsilon": SINK_EPSILON, "share_per_head": [float(x) for x in first],
                 "sink_heads_from_mean": float((first > SINK_EPSILON).mean()),
                 "sink_heads_per_sample": float((share > SINK_EPSILON).mean())}  # fmt: skip
        sinks.update(_sink_keys(bias_file, summary, layer))
    return heads, sinks


def _listed(x: np.ndarray) -> list[Any]:
    """An array as JSON lists, NaN as null."""
    return [_listed(v) for v in x] if x.ndim > 1 else [_value(float(v)) for v in x]


def _sink_keys(bias_file: Any, summary: Any, layer: int) -> dict[str, Any]:
    """The SE of each head's share of key 0, each head's top keys by received weight averaged over samples (ranked
    among the keys seen by enough queries: docs/position-measures.md, 'Sink keys'), and the heads with a secondary
    sink: a top key other than key 0 that holds at least epsilon of the weight, from the mean and in each sample."""
    out: dict[str, Any] = {}
    if summary.holds(layer, se_name(SINK_SHARE)):
        out["share_se_per_head"] = _listed(bias_file.summary_array(se_name(SINK_SHARE), layer))
    least = summary.sink_min_queries(layer) if summary.holds(layer, SINK_KEYS) else None
    if least is None or not summary.holds(layer, SINK_KEYS_OF_MEAN):
        out["note"] = ("the file ranks its sink keys over every key, the last ones too (seen by a few queries "
                       "that attend locally): extract it again to rank them and list secondary sinks")  # fmt: skip
        return out
    values = np.unique(least)
    out["sink_min_queries"] = int(values[0]) if len(values) == 1 else [[int(x) for x in row] for row in least]
    top = bias_file.summary_array(SINK_KEYS_OF_MEAN, layer)  # (H, rank) records, highest first
    out["top_keys_per_head"] = [[{"key": int(r["index"]), "share": _value(float(r["share"]))} for r in row
                                 if r["index"] >= 0] for row in top]  # fmt: skip
    out["secondary_sink_heads"] = [h for h in range(len(top)) if _secondary(top[h, 0])]  # indices from 0
    each = bias_file.summary_array(SINK_KEYS, layer)[..., 0]  # (N, H): each sample's top key
    secondary = (each["index"] > 0) & (np.nan_to_num(each["share"].astype(np.float64)) >= SINK_EPSILON)
    out["samples_with_secondary_sink_per_head"] = [float(x) for x in secondary.mean(0)]
    return out


def _secondary(record: np.void) -> bool:
    """A top key that is not key 0 and holds at least epsilon of the weight (Gu et al.'s threshold); a near-uniform
    head, where any key can rank first, has none."""
    return bool(record["index"] > 0 and float(record["share"]) >= SINK_EPSILON)


def stored_measures(bias_file: Any, layer: int) -> dict[str, Any] | None:
    """docs/position-measures.md's measures of a summary layer as JSON: each mean with its spread over samples and its
    SE (absent with fewer than 3 samples), by head; None where the file holds none."""
    from biasviz.store.datasets import MEASURES

    summary = getattr(bias_file, "summary", None)
    if summary is None or bias_file.bias_only:
        return None
    out: dict[str, Any] = {}
    for row in MEASURES:
        if row.compound or not summary.holds(layer, row.name):
            continue
        values = bias_file.summary_array(row.name, layer)
        if row.dims[0] == "stat":
            doc = {"axis": row.dims[-1], "mean": _listed(values[0]), "std": _listed(values[1])}
        elif row.dims[0] == "operand":  # frequency_use: q's and k's pair norms by head
            doc = {"axis": row.dims[-1], "q": _listed(values[0]), "k": _listed(values[1])}
        else:  # positional_frequency: (head, pair, distance_bin)
            doc = {"axes": list(row.dims[1:]), "mean": _listed(values)}
        if summary.holds(layer, se_name(row.name)):
            doc["se"] = _listed(bias_file.summary_array(se_name(row.name), layer))
        out[row.name] = doc
    if not out:
        return None
    out[DISTANCE_BINS] = [[int(a), int(b)] for a, b in summary.distance_bins()]
    if bias_file.n_samples < 3:
        out["note"] = "no standard errors: they need 3 samples or more"
    return out


def stored_sweep(bias_file: Any, layer: int) -> list[tuple[int, list[HeadDiagnostics]]]:
    """:func:`stored_heads` at each checkpoint of a summary sweep, by training step."""
    steps = bias_file.checkpoints
    if steps is None:
        raise ValueError("not a sweep file")
    return [(step, stored_heads(bias_file.at_checkpoint(c), layer)) for c, step in enumerate(steps)]


__all__ = ["SINK_EPSILON", "stored_heads", "stored_measures", "stored_position", "stored_sweep"]
