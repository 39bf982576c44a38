"""The vocabulary of format 1 (:mod:`biasviz.store.format`): group names, the causal cells, chunk rows under HDF5's
4 GiB limit, summary blocks and the errors the writer and the GPU encoder share, against hand-worked values."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.store.format import (
    FILL,
    FLOAT16_MAX,
    block_size,
    block_starts,
    causal_cells,
    chunk_rows,
    float16_overflow_error,
    layer_group,
    non_finite_error,
    utc_now,
)


def test_a_layer_group_is_named_by_its_index() -> None:
    assert [layer_group(k) for k in (0, 3, 11)] == ["layer_0", "layer_3", "layer_11"]


@pytest.mark.parametrize("t", [1, 2, 5, 17])
def test_the_causal_cells_are_the_keys_up_to_the_query(t: int) -> None:
    cells = causal_cells(t)
    assert cells.dtype == bool and cells.shape == (t, t)
    assert cells.tolist() == [[j <= i for j in range(t)] for i in range(t)]


def test_masked_cells_hold_nan_in_the_bias_and_0_in_the_weights() -> None:
    assert math.isnan(FILL["bias"]) and FILL["weights"] == 0.0
    assert FLOAT16_MAX == 65504.0  # (2 - 2^-10) * 2^15, IEEE half precision's largest finite value


@pytest.mark.parametrize(("seq_len", "itemsize", "rows"), [
    (512, 4, 512),  # 1 MiB: the whole matrix
    (23170, 4, 23170),  # 23170^2 * 4 = 2,147,395,600 <= 2^31: still whole
    (23171, 4, 11586),  # 2,147,580,964 > 2^31: halved, rounding up
    (32768, 4, 16384),  # 2^32 bytes: halved once to 2^31
    (32768, 8, 8192),  # 2^33: halved twice
    (32768, 2, 32768),  # 2^31 exactly: allowed
])  # fmt: skip
def test_a_chunk_is_as_many_rows_as_fit_in_2_gib(seq_len: int, itemsize: int, rows: int) -> None:
    got = chunk_rows(seq_len, itemsize)
    assert got == rows
    assert got * seq_len * itemsize <= 2**31


@pytest.mark.parametrize("seq_len", [1, 7, 512, 1000, 1024, 1025, 16384, 100_000])
@pytest.mark.parametrize("resolution", [1, 3, 300, 1024])
def test_a_block_is_ceil_t_over_r_positions(seq_len: int, resolution: int) -> None:
    b = block_size(seq_len, resolution)
    assert b == max(1, math.ceil(seq_len / resolution))
    assert math.ceil(seq_len / b) <= resolution  # at most R blocks per axis ...
    assert b == 1 or math.ceil(seq_len / (b - 1)) > resolution  # ... with the smallest block that gives that


@pytest.mark.parametrize(("seq_len", "block"), [(10, 4), (12, 4), (1, 1), (7, 1), (1000, 16)])
def test_block_starts_are_the_first_position_of_each_block(seq_len: int, block: int) -> None:
    starts = block_starts(seq_len, block)
    assert starts.dtype == np.int64
    assert starts.tolist() == list(range(0, seq_len, block))
    assert len(starts) == math.ceil(seq_len / block)


def test_the_shared_errors_name_the_kind_the_layer_and_the_fix() -> None:
    err = non_finite_error("weights", 7)
    assert isinstance(err, BiasvizError)
    assert "weights of layer 7" in str(err) and "NaN or infinite" in str(err)
    err = float16_overflow_error("bias", 2, 123456.0)
    assert isinstance(err, BiasvizError)
    assert "bias of layer 2 reaches 1.235e+05" in str(err) and "65504" in str(err) and "--dtype float32" in str(err)


def test_utc_now_is_the_current_second_in_utc() -> None:
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    text = utc_now()
    after = dt.datetime.now(dt.UTC)
    got = dt.datetime.fromisoformat(text)
    assert got.utcoffset() == dt.timedelta(0) and got.microsecond == 0
    assert text.endswith("+00:00") and "." not in text
    assert before <= got <= after
