"""A summary turned from rows formed again to streaming part-way (:mod:`biasviz.extraction.stream_from`).

Each sample a keeping forward reached before the turn reaches the statistics as one whole call formed again from the
bank. Here each such block is held against float64 numpy on the q, k, scale, bias and mask caught at the model's own
SDPA call: its weights, its scores on the cells it attended, those cells (the call's rule, its one mask, or the sample's
own), and its q and k, k multiplied by the scale as a streaming forward sends it. End to end, a call with a window of
its own whose scale changes at the last sample: every map, profile and measure as float64 math on each sample's own
call has it, the bank kept in memory or spilled to a file, and the model run once per sample but the last."""

from __future__ import annotations

import warnings
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.common.errors import MasksDifferBySample
from biasviz.extraction.stream_from import StreamFrom, formed_before
from tests.extraction.one_layer import MARK, Rescaled, assert_as_reference, first_tokens, forwards_of, joined
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, kept_softmax, reference

N = 3
def _ids(how: str) -> torch.Tensor:
    ids = torch.randint(MARK + 1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    if how == "padded":
        ids[1, :4] = 0
    return ids


@pytest.mark.parametrize("how", ["rule", "window", "padded"])
@pytest.mark.parametrize("spilled", [False, True], ids=["in memory", "spilled"])
def test_each_sample_before_is_one_whole_call_as_its_model_formed_it(how: str, spilled: bool) -> None:
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.summaries.bank import SampleBank

    torch.manual_seed(0)
    model = Rescaled(how).eval()
    ids = _ids(how)
    call = caught_call(lambda: model(ids))
    adapter = TracedAdapter(model)
    adapter.prepare(ids.numpy(), -1)
    adapter.resolve_layers(-1)
    bank = SampleBank(N, device=torch.device("cpu"), budget=0 if spilled else None)
    with torch.no_grad(), adapter.keep([0], bank):
        for a in range(N):  # one sample a batch, as --batch-size 1 keeps them
            bank.start = a
            adapter.forward(ids[a : a + 1])
    assert bank.spilled == spilled
    c = float(call["scale"])
    scores = c * np.einsum("nhid,nhjd->nhij", call["q"], call["k"])
    w = kept_softmax(scores, call["kept"])
    with torch.no_grad():
        for a in range(N):
            (block,) = formed_before(adapter, bank, [0], a, T, want_bias=False, operands=True)
            assert (block.layer, block.first, block.r0, block.r1, block.keys) == (0, a, 0, T, T)
            cells = block.attended.expand(1, HEADS, T, T)[0].numpy()
            np.testing.assert_array_equal(cells, call["kept"][a])
            np.testing.assert_allclose(block.weights[0].double().numpy(), w[a], rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(np.where(cells, block.scores[0].double().numpy(), 0.0),
                                       np.where(cells, scores[a], 0.0), rtol=1e-5, atol=1e-5)  # fmt: skip
            np.testing.assert_allclose(block.q[0].double().numpy(), call["q"][a], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(block.k[0].double().numpy(), c * call["k"][a], rtol=1e-6, atol=1e-6)
            assert block.scale == pytest.approx(c) and block.bias is None
    bank.close()


def test_what_is_said_names_the_samples_formed_again() -> None:
    why = MasksDifferBySample("attention call 0 scaled q·k by 0.25 for sample 2")
    said = [StreamFrom(why, None, start).said() for start in (0, 1, 2)]
    assert said[0].endswith("streamed as the model forms its rows, from the first sample")
    assert "from sample 1 on, the sample before it formed again from what its forward kept" in said[1]
    assert "from sample 2 on, the 2 samples before it formed again from what their forwards kept" in said[2]
    assert all(s.startswith(str(why)) for s in said)


def test_a_turn_held_holds_none_of_the_forward_it_left() -> None:
    """The turn is held while every later sample streams: the frames it was raised through (a model's forward, its
    activations) are let go, or they would stay alive beside the streamed sums (0.3 GiB in bench/turned_summary.py)."""
    import gc
    import weakref

    held: list[weakref.ref] = []

    def forward() -> None:
        activations = torch.zeros(1 << 16)
        held.append(weakref.ref(activations))
        raise MasksDifferBySample("attention call 0 added another bias for sample 1")

    def keeping() -> None:
        try:
            forward()
        except MasksDifferBySample as why:
            raise StreamFrom(why, None, 1) from None

    try:
        keeping()
    except StreamFrom as turn:
        kept = turn.kept()
    gc.collect()
    assert held[0]() is None
    assert kept.__traceback__ is None and kept.why.__traceback__ is None and kept.__context__ is None
    assert kept.start == 1 and "added another bias" in kept.said()


@pytest.fixture(scope="module", params=[False, True], ids=["in memory", "spilled"])
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import biasviz.summaries.bank as bank

    torch.manual_seed(0)
    model = Rescaled("window").eval()
    ids = _ids("window")
    ids[N - 1, 3] = MARK  # the last sample's scale differs
    calls = [caught_call(lambda a=a: model(ids[a : a + 1])) for a in range(N)]
    out = tmp_path_factory.mktemp("turned") / "s.h5"
    forwards = forwards_of(model, first_tokens)  # each sample the model runs
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as said:
        if request.param:
            patch.setattr(bank, "BANK_BYTES", 0)
        warnings.simplefilter("always")
        biasviz.extract(model, ids.numpy(), out, summary=True, progress=False, batch_size=1)
    with h5py.File(out, "r") as f:
        stored = {key: f["layer_0"][key][()] for key in f["layer_0"]}
        attrs = dict(f.attrs)
    return {"stored": stored, "attrs": attrs, "said": [str(w.message) for w in said], "forwards": forwards,
            "expected": reference(joined(calls), 1, differ=False), "first": ids[:, 0].tolist(),
            "calls": calls}  # fmt: skip


def test_the_model_runs_once_a_sample_but_the_one_that_showed_it(summarised: dict[str, Any]) -> None:
    first = summarised["first"]
    assert summarised["forwards"] == [first[0], *first, first[-1]], summarised["forwards"]  # the probe first
    (turned,) = [w for w in summarised["said"] if "streamed" in w]
    assert f"from sample {N - 1} on, the {N - 1} samples before it formed again" in turned, turned


@pytest.mark.parametrize("name", [*NAMES, "band_mass", "weights_entropy", "weights_profile_se", "scores_profile_se",
                                  "weights_mean_se"])  # fmt: skip
def test_every_quantity_over_the_window_as_float64_math_has_it(summarised: dict[str, Any], name: str) -> None:
    tol = (2e-4, 1e-5) if name.endswith("_se") else (2e-5, 1e-5)
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, *tol)
    assert summarised["attrs"]["mask"] == "model"


def test_positional_logits_are_formed_from_every_sample_s_q_and_k(summarised: dict[str, Any]) -> None:
    """P (docs/positional.md) over the window, in float64: Q·K' / (N(N - 1)) less the mean of the samples' scores over
    N - 1, Q = Σ_a q_a and K' = Σ_a c_a·k_a summed over every sample (the two before the turn from the bank, the last
    as the model streamed it, each with its own scale c_a)."""
    calls = summarised["calls"]
    q = sum(c["q"][0] for c in calls)
    k = sum(float(c["scale"]) * c["k"][0] for c in calls)
    mean = sum(float(c["scale"]) * np.einsum("hid,hjd->hij", c["q"][0], c["k"][0]) for c in calls) / N
    p = np.einsum("hid,hjd->hij", q, k) / (N * (N - 1)) - mean / (N - 1)
    kept = calls[0]["kept"][0]
    expected = np.where(kept, p, np.nan)
    assert_as_reference(summarised["stored"]["positional_mean"], expected, "positional_mean", 2e-5, 1e-5)
