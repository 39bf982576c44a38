"""What a summary sends a GPU, counted on the CPU: the GPU's shapes forced (:func:`biasviz.common.shapes.gpu_shapes`)
and every operation that reaches torch's dispatcher counted while a layer's rows are formed again.

A GPU runs what it is sent asynchronously, so two things decide its speed besides arithmetic: reads of a value on
the host (each waits for every kernel before it) and the number of kernels. Neither may grow with the number of
samples or of blocks of rows beyond one pass of kernels per block and sample: no read inside the loop, no steps
sized for a CPU's cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import biasviz.extraction.replayed as replayed_module
import biasviz.summaries.layer as layer_module
import biasviz.summaries.replay as replay_module
from biasviz.adapters.base import ModelAdapter
from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.shapes import gpu_shapes
from biasviz.extraction.summary import extract_summary
from tests.conftest import small_model

# what reads a value on the host: each one waits for the device
HOST_READS = {"_local_scalar_dense.default", "item.default", "is_nonzero.default", "nonzero.default", "equal.default"}
ALLOCATIONS = {"empty.memory_format", "empty_strided.default", "new_empty.default", "new_empty_strided.default",
               "empty_like.default"}  # fmt: skip
HEADS = 12  # small_model's
ENCODER_HEADS = 4  # the traced encoder's
# per block of rows and sample, forming the rows included (the model's own arithmetic); the measures' counts of each
# block's own cells, per sample, added 8-10 at 3-5 samples (the attended cells taken from the blocks, not set once)
KERNELS_PER_BLOCK = 275
# a captured bias (one the model added, no scheme declared) is also summarised cell by cell: its maps, profile and SEs
# (425 measured at 4 heads, 3 samples)
BIAS_KERNELS_PER_BLOCK = 450


class Dispatched(TorchDispatchMode):
    """Kernels (operations that are neither views nor bare allocations) and host reads, while :attr:`on`."""

    def __init__(self) -> None:
        super().__init__()
        self.on, self.kernels, self.reads = False, 0, 0

    def counting(self, inner: Callable[..., Any], on: bool) -> Callable[..., Any]:
        """``inner`` with the count turned ``on`` (or off) while it runs, as it was after."""

        def call(*args: Any, **kwargs: Any) -> Any:
            self.on = on
            try:
                return inner(*args, **kwargs)
            finally:
                self.on = not on

        return call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if self.on:
            name = func.__name__
            self.reads += name in HOST_READS
            self.kernels += not func.is_view and name not in ALLOCATIONS and name not in HOST_READS
        return func(*args, **(kwargs or {}))


def _dispatched(monkeypatch: pytest.MonkeyPatch, out: Path, scheme: str, seq_len: int, samples: int, rows: int,
                gpu: bool = True, encoder: str | None = None,
                traced: torch.nn.Module | ModelAdapter | None = None) -> tuple[Dispatched, int]:  # fmt: skip
    """One layer's summary of ``samples`` windows, its rows formed again in blocks of ``rows`` query rows (on the CPU's
    shapes with steps of 2 rows, as a CPU's cache sizes them at long lengths); what it dispatched and its blocks.
    ``encoder``: a traced encoder that sees keys on both sides of its query (tests/extraction/test_summary_bidirectional
    .py's, ``encoder`` its mask), its rows formed against every key, in place of our ``scheme`` model; ``traced``: that
    causal model (4 heads), traced, or that adapter."""
    heads = HEADS if encoder is None and traced is None else ENCODER_HEADS
    budget = heads * replay_module.CELL_BYTES * seq_len * rows
    monkeypatch.setattr(replay_module, "CUDA_REPLAY_BYTES", budget)
    monkeypatch.setattr(replay_module, "REPLAY_BYTES", budget)
    monkeypatch.setattr(replay_module, "MIN_REPLAY_ROWS", 1)
    monkeypatch.setattr(replay_module, "CHUNK_CELLS", heads * seq_len * 2)
    monkeypatch.setattr(layer_module, "CELLS_PER_STEP", heads * seq_len * 2)
    spy = Dispatched()
    monkeypatch.setattr(replayed_module, "replay_layer", spy.counting(replayed_module.replay_layer, True))
    ids = np.random.default_rng(seq_len + samples).integers(1, 60, size=(samples, seq_len))
    if isinstance(traced, ModelAdapter):
        adapter = traced
    elif traced is not None:
        from biasviz.adapters.traced import TracedAdapter

        adapter = TracedAdapter(traced)
    elif encoder is None:
        adapter = BiasGPTAdapter(small_model(scheme), source="test")
    else:
        from biasviz.adapters.traced import TracedAdapter
        from tests.extraction.test_summary_bidirectional import Encoder

        torch.manual_seed(0)
        adapter = TracedAdapter(Encoder(encoder).eval())
    where = torch.device("cuda" if gpu else "cpu")
    blocks = len(list(replay_module.row_blocks(seq_len, heads, where, False, causal=encoder is None)))
    with gpu_shapes() if gpu else contextlib.nullcontext(), spy, torch.no_grad():
        extract_summary(adapter, ids, out, layers=-1, resolution=16, device="cpu", progress=False, force=True)
    return spy, blocks


@pytest.mark.parametrize("scheme", ["alibi", "rope", "fire"])
def test_a_layer_reads_the_host_once_and_sends_kernels_by_blocks_and_samples_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, scheme: str
) -> None:  # fmt: skip
    """Host reads: at most one a layer (a bias declared the same for every input: its comparison, at the end), however
    many blocks and samples; the CPU's shapes read once a block, which shows the count sees them. Kernels: the same
    blocks and samples at twice the length send the same kernels (no step cut to a CPU's cache); per block and sample
    at most KERNELS_PER_BLOCK (190-268 measured), under 2/5 of what steps of two rows send."""
    got = {}
    for key in [(64, 3, 16), (128, 3, 32), (128, 3, 16), (128, 5, 16)]:
        with monkeypatch.context() as m:
            got[key] = _dispatched(m, tmp_path / "s.h5", scheme, *key)
    assert {spy.reads for spy, _ in got.values()} == {0 if scheme == "rope" else 1}
    assert [blocks for _, blocks in got.values()] == [3, 3, 5, 5]
    assert got[64, 3, 16][0].kernels == got[128, 3, 32][0].kernels
    for (_, samples, _), (spy, blocks) in got.items():
        assert spy.kernels <= KERNELS_PER_BLOCK * blocks * samples
    cpu, blocks = _dispatched(monkeypatch, tmp_path / "s.h5", scheme, 128, 3, 16, gpu=False)
    assert got[128, 3, 16][0].kernels < cpu.kernels * 2 / 5
    if scheme != "rope":
        assert cpu.reads > blocks


@pytest.mark.parametrize("mask", ["every key", "window"])
def test_an_encoder_formed_again_against_every_key_reads_nothing_and_sends_kernels_by_blocks_and_samples(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mask: str
) -> None:  # fmt: skip
    """Rows that see keys after their query, formed against every key: no host read in the layer (its cells are known
    before the first row), and the same blocks and samples at twice the length send the same kernels."""
    got = {}
    for key in [(64, 3, 16), (128, 3, 32), (128, 5, 32)]:
        with monkeypatch.context() as m:
            got[key] = _dispatched(m, tmp_path / "s.h5", "", *key, encoder=mask)
    assert {spy.reads for spy, _ in got.values()} == {0}
    assert [blocks for _, blocks in got.values()] == [4, 4, 4]
    assert got[64, 3, 16][0].kernels == got[128, 3, 32][0].kernels
    for (_, samples, _), (spy, blocks) in got.items():
        assert spy.kernels <= KERNELS_PER_BLOCK * blocks * samples


def _bloom() -> ModelAdapter:
    """transformers' BLOOM (2 layers, 4 heads, random weights), opened by its hooks: its bias m·j, a row of keys."""
    from transformers import BloomConfig, BloomModel

    from biasviz.adapters.transformers_alibi import BloomAdapter

    model = BloomModel(BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=ENCODER_HEADS)).eval()
    return BloomAdapter(model, scheme="alibi", n_layers=2, n_heads=ENCODER_HEADS, source="test")


@pytest.mark.parametrize("model", ["eager ALiBi", "BLOOM"])
def test_an_eager_call_with_alibi_formed_again_reads_nothing_and_sends_kernels_by_blocks_and_samples(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: str
) -> None:  # fmt: skip
    """Attention written out in eager PyTorch, ALiBi added (tests/tracing/test_eager_kept.py's, its bias kept as a
    table of j - i), and transformers' BLOOM through its hooks (m·j, a row of keys): each block's bias read off the
    kept form on the device, no host read in the layer but a declared bias's one comparison; the same blocks and samples
    at twice the length send the same kernels."""
    from tests.tracing.test_eager_kept import EagerAlibi

    got = {}
    for key in [(128, 3, 32), (256, 3, 64), (256, 5, 64)]:  # (at T = 64 the bias maps' partial runs send a few more)
        torch.manual_seed(0)
        with monkeypatch.context() as m:
            traced = EagerAlibi("alibi").eval() if model == "eager ALiBi" else _bloom()
            got[key] = _dispatched(m, tmp_path / "s.h5", "", *key, traced=traced)
    # BLOOM's bias is declared the same for every input (context-free): its comparison, read once, at the layer's end
    assert {spy.reads for spy, _ in got.values()} == {0 if model == "eager ALiBi" else 1}
    assert [blocks for _, blocks in got.values()] == [3, 3, 3]
    assert got[128, 3, 32][0].kernels == got[256, 3, 64][0].kernels
    for (_, samples, _), (spy, blocks) in got.items():
        assert spy.kernels <= BIAS_KERNELS_PER_BLOCK * blocks * samples


class PaddedBloom(torch.nn.Module):
    """transformers' BLOOM (1 layer, 4 heads, random weights) given left padding that differs by sample, (first token
    mod 3) times T/8 positions: its cells and its bias m·(j - p) differ by sample."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BloomConfig, BloomForCausalLM

        self.model = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=ENCODER_HEADS))

    def forward(self, ids: torch.Tensor) -> Any:
        pads = ids[:, 0] % 3 * (ids.shape[1] // 8)
        mask = (torch.arange(ids.shape[1])[None] >= pads[:, None]).long()
        return self.model(ids, attention_mask=mask)


def test_a_bias_kept_per_sample_beside_padding_reads_nothing_and_sends_kernels_by_blocks_and_samples(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:  # fmt: skip
    """BLOOM beside padding, traced: each sample's row of keys read from the bank on the device with its own cells, no
    host read in the layer; the same blocks and samples at twice the length send the same kernels."""
    got = {}
    for key in [(128, 3, 32), (256, 3, 64), (256, 5, 64)]:
        torch.manual_seed(0)
        with monkeypatch.context() as m:
            got[key] = _dispatched(m, tmp_path / "s.h5", "", *key, traced=PaddedBloom().eval())
    assert min(spy.kernels for spy, _ in got.values()) > 0  # formed again (not started again, streamed)
    assert {spy.reads for spy, _ in got.values()} == {0}
    assert got[128, 3, 32][0].kernels == got[256, 3, 64][0].kernels
    for (seq_len, samples, rows), (spy, _) in got.items():
        # the blocks of a bias summed per sample over each sample's own cells (more sums a cell: smaller blocks)
        budget = ENCODER_HEADS * replay_module.CELL_BYTES * seq_len * rows
        blocks = len(list(replay_module.row_blocks(seq_len, ENCODER_HEADS, torch.device("cuda"), True, budget,
                                                   by_sample=True)))  # fmt: skip
        assert spy.kernels <= BIAS_KERNELS_PER_BLOCK * blocks * samples
