"""What a file being written learns mid-run: a bias declared the same for every input measured to differ, which switches
it to one bias per sample; and a call taken as causal that attends keys after a query, whose every cell it stores from
then on.

Extraction compares every sample's bias with the first as it is captured (docs/hdf5.md, 'Summary files': measured, not
assumed); :class:`BiasFileWriter` starts with one stored bias where the scheme says it is context-free, and
this is where it turns into one per sample mid-run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import h5py
import numpy as np

from biasviz.store.format import DIMS, layer_group
from biasviz.store.h5io import attr_value


class SharedBiasSwitch:
    """Part of :class:`~biasviz.store.writer.BiasFileWriter`: the root attributes measured while writing, and the
    switch from one stored bias to one per sample."""

    _h5: h5py.File | None
    _written: int
    _filters: Mapping[str, Any]
    _masks: dict[bool, np.ndarray]
    causal: bool
    layer_causal: dict[int, bool]
    has_bias: bool
    has_scores: bool
    bias_shared: bool
    checkpoints: list[int] | None
    layers: list[int]
    n_samples: int
    n_heads: int
    seq_len: int
    dtype: np.dtype

    def _label(self, ds: h5py.Dataset, dims: Sequence[str]) -> None:  # pragma: no cover - the writer's
        raise NotImplementedError

    def record(self, key: str, value: Any) -> None:
        """Set a root attribute of the file being written (a measurement known only once the samples ran)."""
        assert self._h5 is not None
        self._h5.attrs[key] = attr_value(key, value)

    def unshare_bias(self) -> None:
        """A bias declared the same for every sample was measured to differ: store every sample's from now on.

        The samples written so far all equalled the first (that is what was measured up to now), so each gets
        the first's stored chunks. Called between batches, with nothing of an earlier batch still in flight.
        """
        if not self.bias_shared:
            return
        if self.checkpoints is not None:
            raise ValueError("a sweep's bias is shared or not per checkpoint file, before they are joined")
        assert self._h5 is not None
        self.bias_shared = False
        if "bias_shared" in self._h5.attrs:
            del self._h5.attrs["bias_shared"]
        for layer in self.layers:
            grp = self._h5[layer_group(layer)]
            grp.move("bias", ".bias_first")
            first = grp[".bias_first"]
            shape = (self.n_samples, self.n_heads, self.seq_len, self.seq_len)
            ds = grp.create_dataset("bias", shape=shape, dtype=self.dtype, chunks=first.chunks, fillvalue=np.nan,
                                    **self._filters)  # fmt: skip
            self._label(ds, DIMS)
            for h in range(self.n_heads):  # one (T, T) matrix in memory at a time
                matrix = first[0, h]
                for sample in range(self._written):
                    ds[sample, h] = matrix
            del grp[".bias_first"]

    def see_every_key(self, layers: Iterable[int], causal: bool) -> None:
        """``layers``' calls, stored as causal so far, attend keys after a query: from the next batch on, every cell of
        theirs is stored. Where samples were written before, only in a file of the weights alone: those hold 0 after
        their queries, the weight their calls gave there (a bias or scores would hold their mask there). ``causal``: the
        file's rule now (the model's calls all causal or not); a layer says its own where it differs."""
        assert self._h5 is not None and (self._written == 0 or not (self.has_bias or self.has_scores))
        self.causal = self._h5.attrs["causal"] = causal
        self.layer_causal.update(dict.fromkeys(layers, False))
        self._masks.setdefault(False, np.zeros((self.seq_len, self.seq_len), dtype=bool))
        for layer, rule in self.layer_causal.items():
            held = self._h5[layer_group(layer)].attrs
            held.pop("causal", None)
            if rule != causal:
                held["causal"] = rule

    def _skip(self, kind: str, sample: int) -> bool:
        """A shared bias is stored at sample 0 only: the same matrix given for a later sample is not stored again."""
        return kind == "bias" and self.bias_shared and sample != 0
