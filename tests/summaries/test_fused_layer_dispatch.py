"""What the fused path sends a GPU besides its two kernels, counted on the CPU with the GPU's shapes forced: the
torch operations and host reads of a layer's fused summary (the bias measured against f(d), the finish of every
reducer), while the kernels' accumulators come from float64 numpy and are not counted.

A layer reads the host a fixed number of times (6 measured: finiteness, the bias check, the SEs' sample counts),
whatever its length and number of samples; its operations do not grow
with the length (but for a few by its number of distance bins), and with the samples only by the bias check's few
per sample.
"""

from __future__ import annotations

from collections.abc import Callable
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
# SE is formed from the bank sample by sample; 80-85 with FIRE, whose MLP forms each sample's rows for the bias check;
# CABLE's: its rows formed again for its own moments)
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


@pytest.mark.parametrize("scheme", ["alibi", "nope", "fire", "cable"])
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


def _fixed_reads(summarise: Callable[[np.ndarray, Path], object], sizes: list[tuple[int, int]], most_reads: int,
                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path, per_sample: int = PER_SAMPLE) -> None:  # fmt: skip
    """``summarise(ids, out)`` at each (T, N) of ``sizes`` (a short and a long length with N, then the long with more
    samples), its ``_fused`` counted with the GPU's shapes forced: the same host reads (at most ``most_reads``) at
    every size, operations that do not grow with T, and with N by at most ``per_sample`` each."""
    from biasviz.summaries import kernels

    got = {}
    for seq_len, samples in sizes:
        with monkeypatch.context() as m:
            spy = Dispatched()
            m.setenv("BIASVIZ_STATISTICS", "fused")
            m.setattr(kernels, "unavailable", lambda device: None)
            m.setattr(kernels, "layer_accumulators", spy.counting(_reference_accumulators, False), raising=False)
            m.setattr(replayed_module, "_fused", spy.counting(replayed_module._fused, True))
            ids = np.random.default_rng(seq_len + samples).integers(0, 64, size=(samples, seq_len))
            with gpu_shapes(), spy, torch.no_grad():
                summarise(ids, tmp_path / "s.h5")
            got[seq_len, samples] = spy
    reads = {spy.reads for spy in got.values()}
    assert len(reads) == 1 and reads.pop() <= most_reads, {k: s.reads for k, s in got.items()}
    (short, long, more) = sizes
    assert abs(got[long].kernels - got[short].kernels) <= 20  # (a few by the number of distance bins)
    extra = got[more].kernels - got[long].kernels
    assert 0 <= extra <= (more[1] - long[1]) * per_sample, extra


def test_a_fused_layer_of_a_kept_row_of_keys_reads_the_host_a_fixed_number_of_times(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    """BLOOM through its hooks, its bias m·j kept as a row of keys: the layer's whole fused summary, the bias's own
    summary from one sample's rows included, reads the host as often whatever its length and samples, and its
    operations grow with neither but for the bias check's few per sample."""
    from biasviz.extraction.summary import extract_summary
    from tests.summaries.test_fused_layer_kept import _hooked

    def summarise(ids: np.ndarray, out: Path) -> None:
        extract_summary(_hooked("bloom"), ids, out, layers=-1, resolution=16, device="cpu", progress=False,
                        force=True)  # fmt: skip

    _fixed_reads(summarise, [(64, 3), (128, 3), (128, 5)], 10, monkeypatch, tmp_path)


@pytest.mark.parametrize("name", ["gemma2", "gpt_oss", "cells"])
def test_a_fused_softcapped_or_sink_layer_reads_the_host_a_fixed_number_of_times(
        name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    """Gemma 2's softcapped call and GPT-OSS's beside its sink columns (both in a sliding window), and a traced call
    whose bias was kept cell by cell: the sink logits and the bias are handed to the kernels where they are held, read
    nowhere on the host; the layer reads the host as often whatever its length and samples (12 reads measured: the
    mask's checks, the rotary measures' 6)."""
    import biasviz
    from tests.summaries.test_fused_layer_kept import CellsBias, _softmax_extras

    def summarise(ids: np.ndarray, out: Path) -> None:
        torch.manual_seed(0)
        model = _softmax_extras(name) if name != "cells" else CellsBias("alibi").eval()
        biasviz.extract(model, ids, out, summary=True, resolution=16, device="cpu", progress=False, force=True)

    _fixed_reads(summarise, [(32, 3), (64, 3), (64, 5)], 12, monkeypatch, tmp_path)


def test_a_fused_layer_of_bloom_beside_padding_reads_the_host_a_fixed_number_of_times(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    """BLOOM given padding that differs by sample, its row of keys each sample's own: the kernels take each sample's
    row, and the bias's own summary is formed again a sample at a time over its own cells (3 reads measured; 109
    operations a sample more, the rows, cells and per-sample sums of one block of rows)."""
    import biasviz
    from tests.summaries.test_fused_layer_by_sample import _bloom

    def summarise(ids: np.ndarray, out: Path) -> None:
        n, t = ids.shape
        model = _bloom()
        pad = torch.ones(n, t, dtype=torch.long)
        for a in range(n):
            pad[a, : (3 * a) % 7] = 0  # each sample's own padding on the left
        rows = {tuple(r.tolist()): a for a, r in enumerate(torch.from_numpy(ids))}

        def forward(batch: torch.Tensor) -> object:
            return model(batch, attention_mask=pad[[rows[tuple(r.tolist())] for r in batch]])

        biasviz.extract(model, ids, out, summary=True, resolution=16, device="cpu", progress=False, force=True,
                        forward=forward, batch_size=n)  # fmt: skip

    _fixed_reads(summarise, [(32, 3), (64, 3), (64, 5)], 4, monkeypatch, tmp_path, per_sample=120)
