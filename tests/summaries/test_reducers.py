"""The one seam of summaries (:mod:`biasviz.summaries.reducers`): a statistic is a reducer plus one row of the table of
datasets, fed every row block however the model's rows come (formed again from the bank, streamed from the model's
hooks), and written, read, checked and listed as any row of the table.

The statistic added here for the test, each head's summed weight on key 0 per query, is compared with float64 numpy
from the weights the model itself formed (its own hook point, or transformers' ``output_attentions``), not from
biasviz's summary.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.adapters.rows import RowBlock
from biasviz.model import capture
from biasviz.store import datasets
from biasviz.store.reader import open_bias_file
from biasviz.summaries.reducers import Reducer, build, reducer_classes
from biasviz.summaries.sample_profiles import sample_stats
from tests.conftest import small_model

NAME = "first_key_weight"
N, T = 4, 24


class FirstKeyWeight(Reducer):
    """Per sample and head, the weight on key 0 averaged over the queries that attend it."""

    rows = (NAME,)

    def __init__(self, **sizes: Any) -> None:
        super().__init__(**sizes)
        self.zeros("weight", self.heads)
        self.zeros("queries", self.heads)

    def add(self, block: RowBlock) -> None:
        at = (slice(block.first, block.first + block.samples),)
        self._put(self.sums["weight"], at, block.weights[..., 0].sum(-1, dtype=torch.float64))
        seeing = block.cells(self.causal)[..., 0].sum(-1, dtype=torch.float64)  # (1 or S, 1 or H)
        self._put(self.sums["queries"], at, seeing.expand(block.samples, self.heads))

    def result(self) -> dict[str, np.ndarray]:
        stats, se = sample_stats(self.sums["weight"] / self.sums["queries"])
        return {NAME: stats.float().numpy(), **({} if se is None else {datasets.se_name(NAME): se.float().numpy()})}


@pytest.fixture
def one_more_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The statistic's row in the table (and its standard error's), as a new measure adds them."""
    rows = (datasets.DatasetRow(NAME, ("stat", "head"), "share", "weight on key 0 per query",
                                reducer=f"{__name__}:FirstKeyWeight"),
            datasets.DatasetRow(datasets.se_name(NAME), ("head",), "se", "its standard error"))  # fmt: skip
    for row in rows:
        monkeypatch.setitem(datasets.ROWS, row.name, row)
        monkeypatch.setitem(datasets.MEASURE_ROWS, row.name, row)


def expected(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, H, T, T) float64 weights -> (mean, std) over samples and the SE of each head's mean weight on key 0."""
    x = w[..., 0].mean(-1)  # every query of a causal call sees key 0
    n = len(x)
    return np.stack([x.mean(0), x.std(0)]), np.sqrt(((x - x.mean(0)) ** 2).sum(0) / (n * (n - 1)))


def check(path: Path, layer: int, w: np.ndarray) -> None:
    f = open_bias_file(path)
    stats, se = expected(w)
    np.testing.assert_allclose(f.summary_array(NAME, layer), stats, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(f.summary_array(datasets.se_name(NAME), layer), se, rtol=1e-4, atol=1e-7)


def test_our_model_formed_again_reduces_the_new_row(one_more_row: None, tmp_path: Path) -> None:
    model = small_model("alibi")
    ids = np.random.default_rng(3).integers(0, 97, size=(N, T))
    got: list[torch.Tensor] = []
    with capture(model, ["blocks.1.attn.hook_pattern"], lambda t, _n, _r: got.append(t.double())), torch.no_grad():
        model(torch.from_numpy(ids))  # the model's own weights, at its own hook point
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[1], summary=True, device="cpu", progress=False)
    check(out, 1, torch.cat(got).numpy())
    from click.testing import CliRunner

    from biasviz.cli import cli

    shown = CliRunner().invoke(cli, ["info", str(out)])
    assert shown.exit_code == 0 and NAME in shown.output  # listed as any row of the table


def test_a_streamed_transformers_model_reduces_the_new_row(one_more_row: None, tmp_path: Path) -> None:
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(vocab_size=97, hidden_size=32, n_layer=2, n_head=4)).eval()
    ids = np.random.default_rng(4).integers(0, 97, size=(N, T))
    with torch.no_grad():
        w = model(torch.from_numpy(ids), output_attentions=True).attentions[0].double().numpy()
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[0], summary=True, batch_size=2, device="cpu", progress=False)
    check(out, 0, w)


def test_the_table_names_the_reducers_and_each_is_built_once(one_more_row: None) -> None:
    classes = reducer_classes()
    assert FirstKeyWeight in classes and len(classes) == len(set(classes))
    assert FirstKeyWeight not in reducer_classes({k: v for k, v in datasets.ROWS.items() if k != NAME})
    built = build(samples=2, heads=3, seq_len=5, block=1, causal=True, device=torch.device("cpu"))
    assert [type(r) for r in built] == classes


def _blocks(w: torch.Tensor, rows: int) -> list[RowBlock]:
    """(N, H, T, T) weights as one-sample blocks of ``rows`` causal query rows."""
    t = w.shape[-1]
    return [RowBlock(0, a, r0, w[a : a + 1, :, r0 : r0 + rows, : r0 + rows]) for a in range(len(w))
            for r0 in range(0, t, rows)]  # fmt: skip


def test_processes_join_their_samples_in_order_and_held_blocks_count_once() -> None:
    """torchrun: each process's samples, joined in rank order, give what one process gives; a block formed again
    after a bias turned out to differ (held, then discarded) counts once."""
    torch.manual_seed(0)
    w = torch.softmax(torch.randn(4, 2, 6, 6).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), -torch.inf), -1)
    sizes = {"heads": 2, "seq_len": 6, "block": 1, "causal": True, "device": torch.device("cpu")}
    whole = FirstKeyWeight(samples=4, **sizes)
    for block in _blocks(w, 3):
        whole.hold()
        whole.add(block)
        whole.discard()  # formed again: this time it stands
        whole.add(block)
    parts = [FirstKeyWeight(samples=2, **sizes) for _ in range(2)]
    for rank, part in enumerate(parts):
        for block in _blocks(w[2 * rank : 2 * rank + 2], 2):
            part.add(block)
    joined = FirstKeyWeight(samples=2, **sizes)
    joined.join([p.state() for p in parts])
    stats, se = expected(w.double().numpy())
    for got in (whole.result(), joined.result()):
        np.testing.assert_allclose(got[NAME], stats, rtol=1e-6)
        np.testing.assert_allclose(got[datasets.se_name(NAME)], se, rtol=1e-5)


def test_formed_again_streamed_and_beside_the_fused_kernels_the_reducers_agree(
    one_more_row: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """One traced Llama summarised three ways: its SDPA rows formed again by torch, formed again beside the fused
    kernels (their sums from float64 numpy here; the kernels themselves in
    tests/summaries/test_fused_layer_traced.py), and streamed as eager attention forms them. Every reducer's rows
    agree, and the new one equals the float64 math."""
    from transformers import AutoModelForCausalLM

    from biasviz.adapters.transformers_traced import load_transformers_sdpa
    from biasviz.extraction.summary import extract_summary
    from biasviz.summaries import kernels
    from tests.summaries.test_fused_layer import _reference_accumulators
    from tests.summaries.tiny_llama import save_tiny_llama

    path = save_tiny_llama(tmp_path, T)
    ids = np.random.default_rng(6).integers(0, 100, size=(N, T))
    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)
    from biasviz.extraction import replayed

    fed_again: list[list[type]] = []  # beside the kernels: the reducers whose rows their sums do not hold

    def feed_again(form: Any, layer: int, reducers: list[Reducer], **options: Any) -> None:
        fed_again.append([type(r) for r in reducers])
        original(form, layer, reducers, **options)

    original = replayed.feed_again
    monkeypatch.setattr(replayed, "feed_again", feed_again)
    files = {}
    for way in ("torch", "fused", "streamed"):
        monkeypatch.setenv("BIASVIZ_STATISTICS", "fused" if way == "fused" else "torch")
        files[way] = tmp_path / f"{way}.h5"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if way == "streamed":
                model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
                biasviz.extract(model, ids, files[way], layers=[1], summary=True, resolution=T, batch_size=2,
                                device="cpu", progress=False)  # fmt: skip
                with torch.no_grad():
                    w = model(torch.from_numpy(ids), output_attentions=True).attentions[1].double().numpy()
            else:
                extract_summary(load_transformers_sdpa(path), ids, files[way], layers=[1], resolution=T,
                                batch_size=2, device="cpu", progress=False)  # fmt: skip
    for way, said in (("torch", "torch"), ("fused", "fused")):
        with h5py.File(files[way]) as f:
            assert f["layer_1"].attrs["statistics"] == said  # which implementation formed the layer's statistics
    assert fed_again == [[FirstKeyWeight]]  # the attention distance comes from the kernels' sums by distance
    held = {way: open_bias_file(f) for way, f in files.items()}
    names = [n for cls in reducer_classes() for n in cls.rows]
    assert NAME in names and datasets.ATTENTION_DISTANCE in names
    for name in [n for n in [*names, *map(datasets.se_name, names)] if n in datasets.ROWS]:
        want = held["torch"].summary_array(name, 1)
        for way in ("fused", "streamed"):
            got = held[way].summary_array(name, 1)
            for field in want.dtype.names or (None,):  # records (the sink keys): each field
                np.testing.assert_allclose(got if field is None else got[field], want if field is None else want[field],
                                           rtol=1e-5, atol=1e-6, err_msg=f"{name} {field or ''}, {way}")  # fmt: skip
    check(files["streamed"], 1, w)
