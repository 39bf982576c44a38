"""Full files (docs/hdf5.md): every sample's (head, query, key) matrices of each layer, checked on opening against the
file's own header, and read as (sample, head, query, key) datasets whatever the file stores (one checkpoint of a sweep,
or a bias stored once for every sample, :mod:`.views`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import h5py

from biasviz.common.errors import BiasvizError
from biasviz.store.format import layer_group
from biasviz.store.header import FileHeader
from biasviz.store.validation import AttrChecks
from biasviz.store.views import OneCheckpoint, SharedSamples


@dataclass
class FullLayout:
    """What a valid full file holds, and how its matrices are read."""

    path: Path
    h5: h5py.File
    header: FileHeader
    rules: dict[int, bool] = field(default_factory=dict)  # a layer's own rule where the calls differ (its 'causal')

    def causal(self, layer: int) -> bool:
        """Whether ``layer``'s call attends causally: the file's rule, or the layer's own where its group says (an
        encoder-decoder's decoder self-attention beside calls that see every key)."""
        return self.rules.get(layer, self.header.causal)

    def holds(self, kind: str, layer: int) -> bool:
        return kind in self.h5[layer_group(layer)]

    def dataset(self, kind: str, layer: int, checkpoint: int) -> h5py.Dataset | OneCheckpoint | SharedSamples:
        """``kind``'s (sample, head, query, key) dataset of ``layer`` at ``checkpoint``, a shared bias broadcast over
        the samples; one clear error where the file holds none, saying why."""
        if not self.holds(kind, layer):
            if kind == "weights":
                raise BiasvizError(f"{self.path} holds the bias only (extracted with --bias-only, no forward pass): "
                                   "no attention weights")  # fmt: skip
            if kind == "scores":
                raise BiasvizError(f"{self.path} holds no scores: extract with --capture bias,weights,scores to "
                                   "store them")  # fmt: skip
            raise BiasvizError(f"{self.path} holds no {kind} (scheme '{self.header.scheme}' adds no bias)")
        ds = self.h5[f"{layer_group(layer)}/{kind}"]
        held = ds if self.header.steps is None else OneCheckpoint(ds, checkpoint)
        return SharedSamples(held, self.header.n_samples) if kind == "bias" and self.header.bias_shared else held


def validate_full(checks: AttrChecks, header: FileHeader) -> FullLayout:
    """Check every layer of a full file against ``header``: the one it must hold (``weights``, or ``bias`` in a
    --bias-only file) present, and each matrix dataset float of (checkpoint,) sample, head, query, key, with one sample
    for a shared bias. One :class:`BiasvizError` naming the first fault."""
    lead, t, n = header.lead, header.seq_len, header.n_samples
    matrix = (header.n_heads, t, t)
    shapes = {"weights": (*lead, n, *matrix), "scores": (*lead, n, *matrix),
              "bias": (*lead, 1 if header.bias_shared else n, *matrix)}  # fmt: skip
    wanted = "bias" if header.bias_only else "weights"
    rules: dict[int, bool] = {}
    for layer in header.layers:
        group = layer_group(layer)
        checks._refuse_other_files(group)
        grp = checks._h5.get(group)
        if not isinstance(grp, h5py.Group) or not isinstance(grp.get(wanted), h5py.Dataset):
            raise BiasvizError(f"{checks.path} lists layer {layer} but has no {group}/{wanted}")
        if "causal" in grp.attrs:  # the layer's own rule: data from the file, a flag or refused
            rules[layer] = checks._bool_attr("causal", at=group)
        for kind, shape in shapes.items():
            if kind not in grp:
                continue
            checks._refuse_other_files(f"{group}/{kind}")
            ds = grp.get(kind)
            if not isinstance(ds, h5py.Dataset) or ds.shape != shape or ds.dtype.kind != "f":
                what = f"{ds.dtype} {ds.shape}" if isinstance(ds, h5py.Dataset) else "not a dataset"
                shared = " (one matrix for all samples: bias_shared)" if shape[len(lead)] != n else ""
                raise checks._bad(f"{group}/{kind} is {what}, expected float {shape}{shared} (from the attributes "
                                  "n_heads, seq_len and the samples of input_ids)")  # fmt: skip
    return FullLayout(Path(checks.path), checks._h5, header, rules)


__all__ = ["FullLayout", "validate_full"]
