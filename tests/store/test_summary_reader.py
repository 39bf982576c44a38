"""Reading summary files (docs/hdf5.md, 'Summary files'). Full files whose context-free bias is stored once
(bias_shared) are read in test_views.py and test_reader.py.

Files are written here with h5py (tests/summary_files.py), their contents computed with plain numpy, so
the reader is held to the layout, not to biasviz's own writer.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.plotting.load import iter_heads
from biasviz.store import open_bias_file
from biasviz.store.summary_reader import causal_block_counts
from tests.summary_files import (
    alibi,
    block_mean,
    cable,
    diagnostics,
    dist,
    profile,
    weights_of,
    write_summary,
)

N, H, T, R = 3, 12, 48, 10  # blocks of ceil(48 / 10) = 5 positions: 10 blocks, the last one 3 wide


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    b = cable(N, H, T)
    return {"bias": b, "weights": weights_of(b)}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory, data: dict[str, np.ndarray]) -> Path:
    return write_summary(tmp_path_factory.mktemp("s") / "cable.h5", bias=data["bias"], weights=data["weights"],
                         resolution=R)  # fmt: skip


def test_a_summary_file_opens_and_reads_what_numpy_computes(good: Path, data: dict[str, np.ndarray]) -> None:
    cells = dist(T) >= 0
    with open_bias_file(good) as f:
        assert f.is_summary and f.resolution == R and f.block == 5 and f.n_samples == N and f.summary.n_blocks == 10
        assert f.summary_datasets() == ("bias_mean", "bias_std", "weights_mean", "weights_std", "bias_profile",
                                        "weights_profile", "diagnostics")  # fmt: skip
        for kind in ("bias", "weights"):
            x = np.where(cells, data[kind].astype(np.float64), np.nan)
            np.testing.assert_allclose(f.summary_map(f"{kind}_mean"), block_mean(x.mean(0), 5), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(f.summary_map(f"{kind}_std"), block_mean(x.std(0), 5), rtol=1e-5, atol=1e-6)
            mean, std = f.profile(kind)
            expected = profile(data[kind])
            np.testing.assert_allclose(mean, expected[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(std, expected[1], rtol=1e-5, atol=1e-6)
        stored = f.stored_diagnostics()
        for field in ("context_dependence", "toeplitz_residual", "separability_residual"):
            np.testing.assert_array_equal(stored[field], diagnostics(data["bias"])[field])
        assert np.isnan(f.summary_map("bias_mean")[:, 0, 1]).all()  # a block above the diagonal has no cell


def test_block_counts_match_a_brute_force_count() -> None:
    for t, block in ((48, 5), (10, 4), (7, 7), (9, 1), (64, 16)):
        pos = np.arange(t)
        causal = (pos[:, None] >= pos[None, :]).astype(int)
        nb = -(-t // block)
        padded = np.zeros((nb * block, nb * block), int)
        padded[:t, :t] = causal
        brute = padded.reshape(nb, block, nb, block).sum(axis=(1, 3))
        np.testing.assert_array_equal(causal_block_counts(t, block), brute)
    np.testing.assert_array_equal(causal_block_counts(10, 4, causal=False), [[16, 16, 8], [16, 16, 8], [8, 8, 4]])


def _set_attr(key: str, value: object) -> Callable[[h5py.File], None]:
    return lambda f: f.attrs.__setitem__(key, value)


def _replace(name: str, data: object) -> Callable[[h5py.File], None]:
    def edit(f: h5py.File) -> None:
        del f[name]
        f.create_dataset(name, data=data)

    return edit


DAMAGE = {  # what is done to a good file -> the words the one error must contain
    "map of the wrong shape": (_replace("layer_3/bias_mean", np.zeros((H, 10, 11), np.float32)),
                               "layer_3/bias_mean is float32 (12, 10, 11), expected float (12, 10, 10)"),
    "map of integers": (_replace("layer_3/weights_std", np.zeros((H, 10, 10), np.int32)),
                        "layer_3/weights_std is int32"),
    "map missing": (lambda f: f.__delitem__("layer_3/weights_std"), "lacks layer_3/weights_std"),
    "profile of the wrong length": (_replace("layer_3/bias_profile", np.zeros((2, H, T - 1), np.float32)),
                                    "layer_3/bias_profile is float32 (2, 12, 47)"),
    "profile without its std": (_replace("layer_3/weights_profile", np.zeros((1, H, T), np.float32)),
                                "layer_3/weights_profile"),
    "diagnostics missing": (lambda f: f.__delitem__("layer_3/diagnostics"), "lacks layer_3/diagnostics"),
    "diagnostics without a field": (_replace("layer_3/diagnostics", np.zeros(H, [("context_dependence", "f8")])),
                                     "fields context_dependence, toeplitz_residual, separability_residual"),
    "diagnostics of other heads": (_replace("layer_3/diagnostics", diagnostics(cable(2, 4, 8))), "expected (12,)"),
    "resolution missing": (lambda f: f.attrs.__delitem__("resolution"), "attribute 'resolution' cannot be read"),
    "resolution NaN": (_set_attr("resolution", np.nan), "attribute 'resolution' should be an integer"),
    "resolution negative": (_set_attr("resolution", -4), "attribute 'resolution' is -4, expected at least 1"),
    "resolution as text": (_set_attr("resolution", "1024"), "attribute 'resolution' should be an integer"),
    "block inconsistent": (_set_attr("block", 4), "attribute 'block' is 4, but 48 positions at resolution 10"),
    "block zero": (_set_attr("block", 0), "attribute 'block' is 0, expected at least 1"),
    "resolution changed": (_set_attr("resolution", 48), "attribute 'block' is 5, but 48 positions at resolution 48"),
    "samples disagree": (_set_attr("samples", 7), "attribute 'samples' is 7, but 'input_ids' holds 3"),
    "block scale wrong": (_replace("key_block", np.arange(10, dtype=np.int64)), "'key_block' does not hold"),
    "block scale missing": (lambda f: f.__delitem__("query_block"), "'query_block' is absent"),
    "block scale of floats": (_replace("query_block", np.arange(0, 48, 5, dtype=np.float64)),
                              "'query_block' is float64"),
    "summary flag as text": (_set_attr("summary", "yes"), "attribute 'summary' should be true or false"),
    "heads changed": (_set_attr("n_heads", 11), "expected float (11, 10, 10)"),
    "layer group missing": (lambda f: f.move("layer_3", "layer_2"), "lists layer 3 but has no group layer_3"),
}


@pytest.mark.parametrize("case", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_summary_gives_one_error_naming_the_fault(case: str, good: Path, tmp_path: Path) -> None:
    edit, words = DAMAGE[case]
    bad = shutil.copy(good, tmp_path / "bad.h5")
    with h5py.File(bad, "r+") as f:
        edit(f)
    with pytest.raises(BiasvizError) as err:
        open_bias_file(bad)
    message = str(err.value)
    assert words in message, message
    assert message.count("\n") == 0 and str(bad) in message


def test_damaged_values_are_refused_when_read(good: Path, tmp_path: Path) -> None:
    bad = shutil.copy(good, tmp_path / "bad.h5")
    with h5py.File(bad, "r+") as f:
        f["layer_3/bias_mean"][2, 4, 1] = np.nan  # a block with causal cells
        f["layer_3/weights_std"][0, 3, 3] = -1.0
        f["layer_3/diagnostics"][0] = (np.inf, 0.0, 0.0)
    with open_bias_file(bad) as f:
        for read, words in ((lambda: f.summary_map("bias_mean"), "NaN or infinite"),
                            (lambda: f.summary_map("weights_std"), "negative standard deviations"),
                            (f.stored_diagnostics, "negative or infinite")):  # fmt: skip
            with pytest.raises(BiasvizError, match=words):
                read()


def test_a_summary_refuses_per_sample_reads_with_one_clear_error(good: Path) -> None:
    with open_bias_file(good) as f:
        for call in (lambda: f.dataset("bias"), lambda: f.read("weights", sample=0),
                     lambda: next(f.iter_samples("bias")), lambda: next(iter_heads(f, "bias", sample=1))):  # fmt: skip
            with pytest.raises(BiasvizError, match="is a summary file .* re-extract without --summary"):
                call()
        assert f.input_ids().shape == (N, T)


def test_sweep_and_bias_only_summaries(tmp_path: Path, data: dict[str, np.ndarray]) -> None:
    sweep = write_summary(tmp_path / "sweep.h5", bias=data["bias"], weights=data["weights"], resolution=R,
                          steps=[0, 100, 200])  # fmt: skip
    with h5py.File(sweep, "r+") as f:
        f["layer_3/bias_mean"][1] *= 2  # checkpoint 1 differs
    with open_bias_file(sweep) as f:
        assert f.checkpoints == [0, 100, 200] and f.step == 200
        last, middle = f.summary_map("bias_mean"), f.at_checkpoint(1).summary_map("bias_mean")
        np.testing.assert_allclose(middle, 2 * last)
        assert f.at_checkpoint(0).stored_diagnostics()["toeplitz_residual"].shape == (H,)
    only = write_summary(tmp_path / "only.h5", "alibi", bias=alibi(1, H, T), resolution=R, bias_only=True)
    with open_bias_file(only) as f:
        assert f.bias_only and f.n_samples == 0 and not f.summary.holds(3, "weights_mean")
        with pytest.raises(BiasvizError, match="bias only"):
            f.summary_map("weights_mean")
    with h5py.File(only, "r+") as f:
        f.create_dataset("layer_3/weights_mean", data=np.zeros((H, 10, 10), np.float32))
    with pytest.raises(BiasvizError, match="lacks layer_3/weights_std"):
        open_bias_file(only)
