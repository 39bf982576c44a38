"""The T5 bias against transformers' own bucketing, and its buckets' properties for every size."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.models.t5.modeling_t5 import T5Attention

from biasviz.schemes import get_scheme
from biasviz.schemes.t5 import causal_bucket
from tests.properties import SETTINGS
from tests.schemes.scheme_biases import H, T, causal_cells, causal_distance


def test_t5_buckets_equal_transformers() -> None:
    d = torch.arange(0, 5000)
    theirs = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128)
    assert torch.equal(causal_bucket(d, 32, 128), theirs)
    d2 = torch.arange(0, 600)
    theirs2 = T5Attention._relative_position_bucket(-d2, bidirectional=False, num_buckets=16, max_distance=64)
    assert torch.equal(causal_bucket(d2, 16, 64), theirs2)


def test_t5_bias_reads_the_table_by_bucket() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("t5")(H, 48)
    with torch.no_grad():
        b = scheme(None, T, T)[0].numpy()
    table = scheme.table.weight.detach().numpy()  # (32, H)
    d = torch.from_numpy(causal_distance(T)).long()
    buckets = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128).numpy()
    mask = causal_cells(T)
    for h in range(H):
        np.testing.assert_array_equal(b[h][mask], table[buckets, h][mask])


@SETTINGS
@given(buckets=st.sampled_from([8, 16, 32, 64]), max_distance=st.integers(20, 300))
def test_t5_bucket_monotone_and_bounded(buckets: int, max_distance: int) -> None:
    if max_distance <= buckets // 2:
        max_distance = buckets
    d = torch.arange(0, 4 * max_distance)
    got = causal_bucket(d, buckets, max_distance).numpy()
    assert (np.diff(got) >= 0).all() and got.min() == 0 and got.max() < buckets
    exact = buckets // 2
    np.testing.assert_array_equal(got[:exact], np.arange(exact))  # one bucket per small distance
    assert (got[4 * max_distance - 1 :] == buckets - 1).all()  # far distances share the last bucket
