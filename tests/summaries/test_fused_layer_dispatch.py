"""What the fused path sends a GPU besides its two kernels, counted on the CPU with the GPU's shapes forced: the
torch operations and host reads of a layer's fused summary (the bias measured against f(d), the finish of every
reducer), while the kernels' accumulators come from float64 numpy and are not counted.

A layer reads the host a fixed number of times (6 measured: finiteness, the bias check, the SEs' sample counts),
whatever its length and number of samples; its operations do not grow
with the length (but for a few by its number of distance bins), and with the samples only by the bias check's few
per sample.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import biasviz.extraction.replayed as replayed_module
from biasviz.common.shapes import gpu_shapes
from tests.conftest import small_model
from tests.summaries.test_fused_layer import _reference_accumulators
from tests.summaries.test_replay_dispatch import Dispatched

# operations per sample (19 measured with ALiBi: the bias check's, the SEs' folds; 64 without a bias, where P's profile
# SE is formed from the bank sample by sample; 80-85 with FIRE, whose MLP forms each sample's rows for the bias check)
PER_SAMPLE = 100


def _dispatched(monkeypatch: pytest.MonkeyPatch, out: Path, scheme: str, seq_len: int, samples: int) -> Dispatched:
    import biasviz
    from biasviz.summaries import kernels

    spy = Dispatched()
    accumulators = spy.counting(_reference_accumulators, False)  # the kernels' part: not counted
    counted = spy.counting(replayed_module.fused_layer, True)

    monkeypatch.setenv("BIASVIZ_STATISTICS", "fused")
    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", accumulators, raising=False)
    monkeypatch.setattr(replayed_module, "fused_layer", counted)
    ids = np.random.default_rng(seq_len + samples).integers(0, 97, size=(samples, seq_len))
    with gpu_shapes(), spy, torch.no_grad():
        biasviz.extract(small_model(scheme), ids, out, layers=[1], summary=True, resolution=16, device="cpu",
                        progress=False, force=True)  # fmt: skip
    return spy


@pytest.mark.parametrize("scheme", ["alibi", "nope", "fire"])
def test_a_fused_layer_reads_the_host_a_fixed_number_of_times(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                scheme: str) -> None:  # fmt: skip
    got = {}
    for key in [(64, 3), (128, 3), (128, 5)]:
        with monkeypatch.context() as m:
            got[key] = _dispatched(m, tmp_path / "s.h5", scheme, *key)
    reads = {spy.reads for spy in got.values()}
    assert len(reads) == 1 and reads.pop() <= 8, {k: s.reads for k, s in got.items()}
    assert abs(got[128, 3].kernels - got[64, 3].kernels) <= 20  # (a few by the number of distance bins)
    extra = got[128, 5].kernels - got[128, 3].kernels
    assert 0 <= extra <= 2 * PER_SAMPLE, extra


def test_a_fused_layer_of_a_kept_row_of_keys_reads_the_host_a_fixed_number_of_times(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    """BLOOM through its hooks, its bias m·j kept as a row of keys: the layer's whole fused summary, the bias's own
    summary from one sample's rows included, reads the host as often whatever its length and samples, and its
    operations grow with neither but for the bias check's few per sample."""
    from biasviz.extraction.summary import extract_summary
    from biasviz.summaries import kernels
    from tests.summaries.test_fused_layer_kept import _hooked

    got = {}
    for seq_len, samples in [(64, 3), (128, 3), (128, 5)]:
        with monkeypatch.context() as m:
            spy = Dispatched()
            m.setenv("BIASVIZ_STATISTICS", "fused")
            m.setattr(kernels, "unavailable", lambda device: None)
            m.setattr(kernels, "layer_accumulators", spy.counting(_reference_accumulators, False), raising=False)
            m.setattr(replayed_module, "_fused", spy.counting(replayed_module._fused, True))
            ids = np.random.default_rng(seq_len + samples).integers(0, 64, size=(samples, seq_len))
            with gpu_shapes(), spy, torch.no_grad():
                extract_summary(_hooked("bloom"), ids, tmp_path / "s.h5", layers=-1, resolution=16, device="cpu",
                                progress=False, force=True)  # fmt: skip
            got[seq_len, samples] = spy
    reads = {spy.reads for spy in got.values()}
    assert len(reads) == 1 and reads.pop() <= 10, {k: s.reads for k, s in got.items()}
    assert abs(got[128, 3].kernels - got[64, 3].kernels) <= 20  # (a few by the number of distance bins)
    extra = got[128, 5].kernels - got[128, 3].kernels
    assert 0 <= extra <= 2 * PER_SAMPLE, extra


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "cells"])
def test_a_fused_softcapped_or_sink_layer_reads_the_host_a_fixed_number_of_times(
        name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    """Gemma 2's softcapped call and GPT-OSS's beside its sink columns (both in a sliding window), and a traced call
    whose bias was kept cell by cell: the sink logits and the bias are handed to the kernels where they are held, read
    nowhere on the host; the layer reads the host as often whatever its length and samples."""
    import biasviz
    from biasviz.summaries import kernels
    from tests.summaries.test_fused_layer_kept import CellsBias, _softmax_extras

    def model() -> torch.nn.Module:
        if name != "cells":
            return _softmax_extras(name)
        torch.manual_seed(0)
        return CellsBias("alibi").eval()

    got = {}
    for seq_len, samples in [(32, 3), (64, 3), (64, 5)]:
        with monkeypatch.context() as m:
            spy = Dispatched()
            m.setenv("BIASVIZ_STATISTICS", "fused")
            m.setattr(kernels, "unavailable", lambda device: None)
            m.setattr(kernels, "layer_accumulators", spy.counting(_reference_accumulators, False), raising=False)
            m.setattr(replayed_module, "_fused", spy.counting(replayed_module._fused, True))
            ids = np.random.default_rng(seq_len + samples).integers(0, 64, size=(samples, seq_len))
            with gpu_shapes(), spy, torch.no_grad():
                biasviz.extract(model(), ids, tmp_path / "s.h5", summary=True, resolution=16,
                                device="cpu", progress=False, force=True)  # fmt: skip
            got[seq_len, samples] = spy
    reads = {spy.reads for spy in got.values()}  # 12 measured: the mask's checks, the rotary measures' 6
    assert len(reads) == 1 and reads.pop() <= 12, {k: s.reads for k, s in got.items()}
    assert abs(got[64, 3].kernels - got[32, 3].kernels) <= 20
    extra = got[64, 5].kernels - got[64, 3].kernels
    assert 0 <= extra <= 2 * PER_SAMPLE, extra
