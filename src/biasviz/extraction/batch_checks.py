"""What a full file's batch must hold before it is stored: every asked layer's matrices, and calls whose values
there are the model's; and what a call taken as causal that attends keys after a query in a later batch changes.

A call whose own mask removes cells that its rule keeps (padding given as an ``attention_mask``, packed documents, a
sliding window; docs/hdf5.md, 'Attended cells') holds its mask there, not the model's values, in its scores and bias.
A call that comes whole shows them: its scores (or, without them, its bias) are NaN or -inf exactly where it masked
(:attr:`~biasviz.extraction.full_matrices.FullMatrices.marked`). A full file stores every cell of the rule (j <= i,
or every cell), so such a call's bias or scores are refused with what to do instead, before anything is published,
rather than taken for a broken model; its weights alone are stored as the model formed them.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.adapters.rows import plain_cells
from biasviz.common.errors import BiasvizError, past_query_said
from biasviz.extraction.full_matrices import FullMatrices


def check_own_masks(got: FullMatrices, adapter: ModelAdapter, kinds: list[str]) -> None:
    """Refuse a batch in which a call whose bias or scores the file stores masked cells that its rule keeps."""
    stored = [kind for kind in ("bias", "scores") if kind in kinds]
    if not stored:
        return
    for layer, marked in sorted(got.marked.items()):
        if not any(layer in got.of(kind) for kind in stored):
            continue
        cells = torch.isfinite(marked)
        t = cells.shape[-1]
        causal = adapter.layer_causal(layer)
        if bool((cells | ~plain_cells(0, t, t, causal, cells.device)).all()):  # every cell of its rule
            continue
        rule = "causal triangle (j <= i)" if causal else "keys a bidirectional call sees"
        where = rule.split(" (")[0]
        raise BiasvizError(f"the attention call of layer {layer} masks cells of its own within the {rule} "
                           "(padding given as an attention_mask, packed documents or a sliding window): a full file "
                           f"stores the {' and '.join(stored)} in every cell of the {where}, and where the call "
                           "masked, those cells hold its mask, not the model's values; 'extract --summary' takes each "
                           "call's own cells (docs/hdf5.md, 'Attended cells'), and '--capture weights' stores the "
                           "weights alone")  # fmt: skip


def check_captured(got: FullMatrices, layers: list[int], kinds: list[str], adapter: ModelAdapter) -> None:
    """Refuse a batch missing a layer's matrices, saying why they were not formed."""
    missing = [layer for kind in kinds for layer in layers if layer not in got.of(kind)]
    if "scores" in kinds and all(layer in got.weights for layer in layers) and missing:
        raise BiasvizError(f"the scores of layer(s) {sorted(set(missing))} were not formed: --capture scores takes "
                           "SDPA and flex_attention calls (and biasviz's own models)")  # fmt: skip
    if missing:
        raise BiasvizError(f"the {adapter.architecture} model ran but nothing was captured for layer(s) "
                           f"{sorted(set(missing))}; its attention may use a fused kernel that never forms "
                           "the weights")  # fmt: skip


def see_every_key(layers: list[int], adapter: ModelAdapter, writer: Any, encoder: Any, kinds: list[str],
                  start: int) -> None:  # fmt: skip
    """The streamed calls of ``layers``, stored as causal, attend keys after a query from the batch of sample ``start``
    on (their adapter now takes them as calls that see every key), before anything of that batch is stored: the file
    stores their every cell from here on, the samples before holding weight 0 after their queries, as their calls gave.
    A file of their bias or scores is refused where samples came before (theirs would hold their mask there, within the
    rule of a call that sees every key); in the first batch, :func:`check_own_masks` reads each sample's own."""
    said = "; ".join(past_query_said(f"attention call {layer}", start) for layer in layers)
    stored = [kind for kind in ("bias", "scores") if kind in kinds]
    if stored and start > 0:
        raise BiasvizError(f"{said}; the samples before sample {start} attended only keys up to their query, and a "
                           f"full file stores the {' and '.join(stored)} in every cell of a call that sees every key, "
                           "which their calls masked: 'extract --summary' takes each sample's own cells (docs/hdf5.md, "
                           "'Attended cells'), and '--capture weights' stores the weights alone")  # fmt: skip
    writer.see_every_key(layers, bool(adapter.causal))
    if encoder is not None:
        encoder.see_every_key(layers)
    warnings.warn(f"{said}; the file stores every cell of the call from sample {start} on (the samples before hold "
                  "weight 0 after their queries, as their calls gave)", stacklevel=4)
