"""A bias stored once for every sample (bias_shared), seen as one matrix per sample
(:class:`biasviz.store.views.SharedSamples`): it reads as the bias repeated for every sample, and its context
dependence is exactly 0.

Files are written here with h5py (tests/summary_files.py), their contents computed with plain numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.diagnostics.measures import diagnose_dataset
from biasviz.diagnostics.profiles import dataset_profiles
from biasviz.plotting.load import load_heads
from biasviz.store import open_bias_file
from tests.summary_files import alibi, cable, weights_of, write_full

H, T = 12, 48


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("shared")
    bias, weights = alibi(4, H, T), weights_of(cable(4, H, T))
    return (write_full(d / "shared.h5", "alibi", bias[:1], weights, shared=True),
            write_full(d / "repeated.h5", "alibi", bias, weights))  # fmt: skip


def test_a_shared_bias_reads_as_the_bias_repeated_for_every_sample(shared_pair: tuple[Path, Path]) -> None:
    with open_bias_file(shared_pair[0]) as s, open_bias_file(shared_pair[1]) as r:
        assert s.bias_shared and not r.bias_shared and s.n_samples == r.n_samples == 4
        np.testing.assert_array_equal(s.read("bias"), r.read("bias"))
        for k in (0, 3, -1):
            np.testing.assert_array_equal(s.read("bias", sample=k), r.read("bias", sample=k))
        np.testing.assert_array_equal(s.read("bias", sample=slice(1, 3)), r.read("bias", sample=slice(1, 3)))
        for a, b in zip(s.iter_samples("bias"), r.iter_samples("bias"), strict=True):
            np.testing.assert_array_equal(a, b)
        ds = s.dataset("bias")
        assert ds.shape == (4, H, T, T) and ds.stored.shape == (1, H, T, T)
        np.testing.assert_array_equal(ds[2, 5], r.dataset("bias")[2, 5])
        np.testing.assert_array_equal(ds[:, 1, 7], r.dataset("bias")[:, 1, 7])
        with pytest.raises(BiasvizError, match="sample 4 out of range"):
            s.read("bias", sample=4)
        np.testing.assert_array_equal(s.read("weights"), r.read("weights"))  # weights stay per sample
        mean_s, mean_r = load_heads(s, "bias", sample="mean"), load_heads(r, "bias", sample="mean")
        np.testing.assert_array_equal(mean_s.data, mean_r.data)
        assert not np.nan_to_num(load_heads(s, "bias", sample="std").data).any()


def test_a_shared_bias_has_context_dependence_exactly_zero(shared_pair: tuple[Path, Path]) -> None:
    with open_bias_file(shared_pair[0]) as s, open_bias_file(shared_pair[1]) as r:
        shared, repeated = list(diagnose_dataset(s.dataset("bias"))), list(diagnose_dataset(r.dataset("bias")))
        for a, b in zip(shared, repeated, strict=True):
            assert a.context_dependence == 0.0 and a.samples == 4 and not a.notes
            assert a.toeplitz_residual == b.toeplitz_residual == 0.0
            np.testing.assert_array_equal(a.profile_mean, b.profile_mean)
        ps, pr = dataset_profiles(s.dataset("bias")), dataset_profiles(r.dataset("bias"))
        np.testing.assert_array_equal(ps.mean, pr.mean)
        assert ps.samples == 4 and not ps.std.any()
