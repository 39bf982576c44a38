"""What a traced call kept for a summary attended (:mod:`biasviz.adapters.kept_calls`): its one mask, or its rule, and
each sample's own cells, against masks written out by hand with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.kept_calls import KeptCall, added_bias, own_cells
from biasviz.common.errors import MasksDifferBySample
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


def test_the_added_bias_is_the_float_mask_over_the_cells_attended_and_0_elsewhere() -> None:
    rng = np.random.default_rng(1)
    values = rng.standard_normal((1, H, T, T)).astype(np.float32)
    causal = np.tril(np.ones((T, T), bool))
    mask = np.where(causal, values, -np.inf).astype(np.float32)
    ops = _ops(np.broadcast_to(causal, (2, 1, T, T)).copy())
    ops.additive = torch.from_numpy(mask)
    got = added_bias(ops).numpy()
    assert got.shape == (2, H, T, T) and np.array_equal(got[1], np.where(causal, values[0], 0.0))
    ops.additive = None  # a call that adds none: 0 everywhere
    assert not added_bias(ops).any()
