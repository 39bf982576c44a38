"""The focused head's docs/position-measures.md measures on the page (summary files, the weights): the weight a query
puts at each distance bin and on each tenth of the keys it sees, with their standard errors where the file holds them.

The page draws them under the distance profile, each with its 95 % interval (mean ± 1.96 SE), as ``plot --kind
bands`` and ``--kind context`` do: per distance, each bin's weight over its width.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from biasviz.explorer.encode import pack_bytes
from biasviz.store import BiasFile
from biasviz.store.datasets import BAND_MASS, CONTEXT_MASS, se_name


def _packed(values: np.ndarray) -> str:
    return pack_bytes(np.asarray(values, "<f4").tobytes())


def layer_measures(f: BiasFile, layer: int, kind: str) -> list[dict[str, Any]] | None:
    """Per head, what the page draws of band and context mass; None where the file holds none (not a summary of the
    weights, or one written before docs/position-measures.md)."""
    if not f.is_summary or kind != "weights" or f.summary is None:
        return None
    resolved = f.resolve_layer(layer)
    if not (f.summary.holds(resolved, BAND_MASS) and f.summary.holds(resolved, CONTEXT_MASS)):
        return None
    bins = f.summary.distance_bins()
    width = (bins[:, 1] - bins[:, 0] + 1).astype(np.float64)
    got = {}
    for name, scale in ((BAND_MASS, width), (CONTEXT_MASS, 1.0)):
        mean = f.summary_array(name, resolved)[0] / scale
        se = f.summary_array(se_name(name), resolved) / scale if f.summary.holds(resolved, se_name(name)) else None
        got[name] = (mean, se)
    heads = []
    for h in range(f.n_heads):
        one = {}
        for key, name in (("band", BAND_MASS), ("context", CONTEXT_MASS)):
            mean, se = got[name]
            one[key] = {"mean": _packed(mean[h]), "se": None if se is None else _packed(se[h])}
        heads.append(one)
    return [{**m, "bins": bins.tolist()} for m in heads]


__all__ = ["layer_measures"]
