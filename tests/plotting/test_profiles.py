"""Distance profiles read from a file (:mod:`biasviz.plotting.profiles`): a summary's as stored, a full file's computed,
both against numpy's per-diagonal mean and std of the matrices the test wrote; and the words a figure's title says."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.plotting.profiles import YLABELS, as_heads, blocks_note, file_profiles, profile_note, samples_phrase
from biasviz.store import open_bias_file
from tests.summary_files import cable, profile, weights_of, write_full, write_summary

N, H, T = 3, 2, 8


@pytest.fixture(scope="module")
def bias() -> np.ndarray:
    return cable(N, H, T)


def test_a_summarys_profiles_are_those_it_stores(tmp_path: Path, bias: np.ndarray) -> None:
    path = write_summary(tmp_path / "s.h5", bias=bias, weights=weights_of(bias), resolution=4)
    want = profile(bias)
    with open_bias_file(path) as bf:
        got = file_profiles(bf, "bias", 3)
        assert (got.start, got.samples) == (0, N)
        np.testing.assert_allclose(got.mean, want[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got.std, want[1], rtol=1e-6, atol=1e-6)
        with pytest.raises(BiasvizError, match=r"s\.h5 is a summary file: .* drop --normalize"):
            file_profiles(bf, "bias", 3, normalize="diagonal")


def test_a_full_files_profiles_are_computed_and_only_the_bias_is_normalized(tmp_path: Path,
                                                                           bias: np.ndarray) -> None:  # fmt: skip
    weights = weights_of(bias)
    path = write_full(tmp_path / "f.h5", "cable", bias, weights)
    relative = bias.astype(np.float64) - np.diagonal(bias, axis1=-2, axis2=-1)[..., :, None]  # b(i, j) - b(i, i)
    with open_bias_file(path) as bf:
        for kind, normalize, x in (("bias", "none", bias), ("bias", "diagonal", relative),
                                   ("weights", "diagonal", weights)):  # fmt: skip
            got = file_profiles(bf, kind, 3, normalize)
            want = profile(x)
            assert (got.start, got.samples) == (0, N)
            np.testing.assert_allclose(got.mean, want[0], rtol=1e-5, atol=1e-6, err_msg=f"{kind} {normalize}")
            np.testing.assert_allclose(got.std, want[1], rtol=1e-5, atol=1e-6, err_msg=f"{kind} {normalize}")


def test_a_used_cell_that_is_nan_is_one_error_naming_the_layer(tmp_path: Path, bias: np.ndarray) -> None:
    broken = bias.copy()
    broken[1, 0, 5, 2] = np.nan  # j <= i: a cell the model uses
    path = write_full(tmp_path / "f.h5", "cable", broken, weights_of(bias))
    with open_bias_file(path) as bf, pytest.raises(BiasvizError) as exc:
        file_profiles(bf, "bias", 3)
    assert str(exc.value) == (f"{path}: the bias of layer 3: NaN or infinite values in cells the model uses; the file "
                              "is damaged or was not written by 'biasviz extract'; extract it again")  # fmt: skip


def test_each_head_carries_only_its_profile() -> None:
    mean, std = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    heads = as_heads(SimpleNamespace(mean=mean, std=std, samples=5))
    assert [h.head for h in heads] == [1, 2] and {h.samples for h in heads} == {5}
    assert heads[1].profile_mean.tolist() == [3.0, 4.0, 5.0] and heads[1].profile_std.tolist() == [1.0] * 3
    assert all(h.context_dependence is None and h.toeplitz_residual is None for h in heads)


def test_the_words_of_the_titles() -> None:
    assert samples_phrase(SimpleNamespace(bias_only=False, n_samples=1)) == "1 sample"
    assert samples_phrase(SimpleNamespace(bias_only=False, n_samples=64)) == "64 samples"
    assert samples_phrase(SimpleNamespace(bias_only=True, n_samples=0)) == "the scheme's formula (--bias-only, no text)"
    assert profile_note(1, False) == "mean ± 1 std over 1 sample and the cells at each distance"
    assert profile_note(8, False) == "mean ± 1 std over 8 samples and the cells at each distance"
    assert profile_note(0, True) == "mean ± 1 std over the cells at each distance (the scheme's formula, --bias-only)"
    assert blocks_note(SimpleNamespace(block=None)) is None  # a full file
    assert blocks_note(SimpleNamespace(block=1)) is None  # a summary exact per cell
    assert blocks_note(SimpleNamespace(block=16)) == "block means of 16 × 16 positions"
    assert blocks_note(SimpleNamespace(block=16), "std") == "in blocks of 16 × 16 positions"
    assert set(YLABELS) == {"bias", "weights"} and all("mean ± 1 std" in label for label in YLABELS.values())
