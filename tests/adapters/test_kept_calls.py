"""What a traced call kept for a summary attended (:mod:`biasviz.adapters.kept_calls`): its one mask, or its rule, and
each sample's own cells, against masks written out by hand with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.kept_calls import KeptCall, KeptCalls, own_cells
from biasviz.common.errors import MasksDifferBySample
from biasviz.summaries.bank import SampleBank
from biasviz.tracing.calls import SdpaOperands

T, H = 6, 3


def _ops(kept: np.ndarray, scale: float = 0.5) -> SdpaOperands:
    b = kept.shape[0]
    return SdpaOperands(q=torch.zeros(b, H, T, 4), k=torch.zeros(b, H, T, 4), kept=torch.from_numpy(kept),
                        additive=None, scale=scale)  # fmt: skip


@pytest.mark.parametrize("causal", [True, False])
def test_a_call_s_rule_keeps_no_mask_and_forms_its_rows(causal: bool) -> None:
    rule = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    kept = KeptCall.of(_ops(np.broadcast_to(rule, (2, 1, T, T)).copy()), causal)
    assert kept.mask is None and kept.scale == 0.5
    assert np.array_equal(kept.rows(2, 5, torch.device("cpu"), T)[0, 0].numpy(), rule[2:5])
    assert np.array_equal(kept.rows(2, 5, torch.device("cpu"))[0, 0].numpy(), rule[2:5, :5])  # a causal call's keys


def test_one_mask_for_every_sample_is_kept_once_and_sliced() -> None:
    i, j = np.indices((T, T))
    window = np.stack([(abs(i - j) < w) for w in (1, 2, 3)])  # (H, T, T): each head a window of its own
    kept = KeptCall.of(_ops(np.broadcast_to(window, (2, H, T, T)).copy()), causal=False)
    assert kept.mask is not None and tuple(kept.mask.shape) == (1, H, T, T)
    assert np.array_equal(kept.rows(1, 4, torch.device("cpu"), T)[0].numpy(), window[:, 1:4])


def test_samples_of_a_batch_masked_differently_have_no_one_mask() -> None:
    kept = np.broadcast_to(np.tril(np.ones((T, T), bool)), (2, 1, T, T)).copy()
    kept[1, 0, :, 0] = False  # sample 1 hides key 0
    with pytest.raises(MasksDifferBySample):
        KeptCall.of(_ops(kept), causal=True)


def test_the_digest_tells_rules_scales_and_masks_apart() -> None:
    causal = KeptCall(0.5, None, True).digest
    assert torch.equal(causal, KeptCall(0.5, None, True).digest)
    assert not torch.equal(causal, KeptCall(0.5, None, False).digest)
    assert not torch.equal(causal, KeptCall(0.25, None, True).digest)
    assert not torch.equal(causal, KeptCall(0.5, torch.ones(1, 1, T, T, dtype=torch.bool), True).digest)


def test_own_cells_are_one_set_for_all_heads_where_they_agree_and_one_a_head_where_not() -> None:
    rng = np.random.default_rng(0)
    alike = np.broadcast_to(rng.random((2, 1, T, T)) > 0.5, (2, H, T, T)).copy()
    got = own_cells(torch.from_numpy(alike), 2)
    assert tuple(got.shape) == (2, 1, T, T) and np.array_equal(got[:, 0].numpy(), alike[:, 0])
    differ = rng.random((1, H, T, T)) > 0.5
    got = own_cells(torch.from_numpy(differ), 3)  # one mask broadcast over a batch of 3
    assert tuple(got.shape) == (3, H, T, T) and all(np.array_equal(got[a].numpy(), differ[0]) for a in range(3))


@pytest.mark.parametrize(("second", "said"), [((0.25, None), "scaled q·k by 0.25"),
                                              ((0.5, 3.0), "capped its scores at 3.0")])  # fmt: skip
def test_a_later_sample_s_other_scale_or_cap_is_named_and_streamed(second: tuple[float, float | None],
                                                                   said: str) -> None:  # fmt: skip
    """Rows formed again take one scale and one softcap for every sample: a later sample's other one raises what starts
    the summary again, streamed, naming what changed."""

    causal = np.broadcast_to(np.tril(np.ones((T, T), bool)), (1, 1, T, T)).copy()
    calls = KeptCalls(SampleBank(2, device=torch.device("cpu")), [0], lambda i: True, lambda i: False,
                      lambda i, start: AssertionError(f"call {i}, sample {start}"))  # fmt: skip
    calls.keep(0, _ops(causal, 0.5))
    calls.bank.start = 1
    later = _ops(causal, second[0])
    later.softcap = second[1]
    with pytest.raises(MasksDifferBySample, match=said):
        calls.keep(0, later)


def _bloom(pads: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """BLOOM's bias as its forward writes it beside left padding, m_h·(j - p) for a sample padded by p, over its causal
    cells of keys j >= p (what it attends; -inf elsewhere): (B, H, T, T) float32 and the cells (B, 1, T, T)."""
    i, j = np.indices((T, T))
    slopes = np.array([0.5, 0.25, 0.125])[:, None, None]
    kept = np.stack([(j <= i) & (j >= p) for p in pads])[:, None]
    bias = np.stack([slopes * (j - p) for p in pads]).astype(np.float32)
    return np.where(kept, bias, -np.inf).astype(np.float32), kept


def _calls(samples: int, *, joined: bool = False) -> KeptCalls:
    bank = SampleBank(samples, device=torch.device("cpu"))
    bank.cells_by_sample = not joined  # torchrun's processes meet in one bank
    return KeptCalls(bank, [0], lambda i: True, lambda i: True,
                     lambda i, start: AssertionError(f"call {i}, sample {start}"))


@pytest.mark.parametrize("batch", [1, 3])
def test_a_bias_that_differs_by_sample_in_its_form_is_banked_per_sample_and_forms_each_one_s_rows(batch: int) -> None:
    """BLOOM's positions start after its padding, so its bias differs by sample: each sample's own row of keys goes
    into the bank (the first's too), H·T floats, and the rows formed again add exactly each sample's values."""
    pads = (0, 2, 1)
    mask, kept = _bloom(pads)
    calls = _calls(3)
    for start in range(0, 3, batch):
        calls.bank.start = start
        ops = _ops(kept[start : start + batch])
        ops.additive = torch.from_numpy(mask[start : start + batch])
        calls.keep(0, ops)
    assert calls.bias_by_sample == {0} and calls.biases[0].form == "key"
    assert calls.bank.seq_len(0, "bias") == T  # a row of keys a sample, not its T² cells
    for a in range(3):
        for r0, r1 in ((0, T), (3, 5)):
            got = calls.rows_again(0, calls.bank, a, r0, r1, H, want_bias=True)
            want = np.where(kept[a, :, r0:r1, :r1], mask[a, :, r0:r1, :r1], 0.0)
            assert np.array_equal(got.bias[0].numpy(), want), (a, r0, r1)


def test_a_bias_that_differs_by_sample_off_its_form_or_under_torchrun_starts_again() -> None:
    """A later sample's bias of each cell (one of the text) would bank H·T² floats a sample, and torchrun's processes
    are joined by one bias: both start the summary again, streamed."""
    mask, kept = _bloom((0, 2))
    cells = mask[1:].copy()
    cells[0, 1, 4, 3] += 1.0  # off the row of keys
    for joined, later in ((False, cells), (True, mask[1:])):
        calls = _calls(2, joined=joined)
        first = _ops(kept[:1])
        first.additive = torch.from_numpy(mask[:1])
        calls.keep(0, first)
        calls.bank.start = 1
        ops = _ops(kept[1:])
        ops.additive = torch.from_numpy(later)
        with pytest.raises(MasksDifferBySample, match="added another bias for sample 1"):
            calls.keep(0, ops)


def test_calls_with_one_mask_share_one_copy_of_it_and_hold_no_view_of_the_batch() -> None:
    """Every layer of a model with a sliding window masks the same cells: the mask is held once, one sample's T² cells
    (not the batch's), and a layer masked otherwise holds its own."""
    i, j = np.indices((T, T))
    window = np.broadcast_to(((j <= i) & (i - j < 3))[None, None], (3, 1, T, T)).copy()  # a batch of 3, one mask
    other = np.broadcast_to(((j <= i) & (i - j < 2))[None, None], (3, 1, T, T)).copy()
    calls = KeptCalls(SampleBank(3, device=torch.device("cpu")), [0, 1, 2], lambda i: True, lambda i: False,
                      lambda i, start: AssertionError(f"call {i}, sample {start}"))  # fmt: skip
    for index, cells in enumerate((window, window.copy(), other)):
        calls.keep(index, _ops(cells))
    masks = [calls.formed[index].mask for index in range(3)]
    assert masks[0] is masks[1] and masks[2] is not masks[0]
    assert all(m.untyped_storage().nbytes() == T * T for m in masks)  # one sample's cells, not the batch's
    assert np.array_equal(masks[0][0, 0].numpy(), window[0, 0]) and np.array_equal(masks[2][0, 0].numpy(), other[0, 0])
