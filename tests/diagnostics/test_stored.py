"""Diagnostics as a summary stores them (:mod:`biasviz.diagnostics.stored`), read, never recomputed: the files are
written with h5py (tests/summary_files.py, the position datasets by hand below), and what the readers give is set
against the numbers written and against thresholds worked by hand."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.diagnostics.stored import SINK_EPSILON, stored_heads, stored_measures, stored_position, stored_sweep
from biasviz.store import open_bias_file
from tests.summary_files import cable, diagnostics, profile, weights_of, write_full, write_summary

N, H, T = 4, 3, 10
RECORD = np.dtype([("index", np.int32), ("share", np.float32)])
# each sample's (rows) weight on key 0 per head (columns): above 0.3 in 2, 1, 1 and 3 of the heads: 7 of 12
SINK_SHARE = np.array([[0.1, 0.4, 0.9], [0.29, 0.31, 0.2], [0.5, 0.0, 0.29], [0.6, 0.7, 0.8]], np.float32)
KEY0 = [0.1, 0.5, 0.31]  # the mean weight on key 0 per head: above 0.3 in 2 of 3 heads


def records(index: list[list[int]], share: list[list[float]], shape: tuple[int, ...]) -> np.ndarray:
    """Sink records of ``shape`` (..., rank 8): the given top ranks, the rest empty (index -1)."""
    out = np.zeros(shape, RECORD)
    out["index"] = -1
    k = np.asarray(index).shape[-1]
    out["index"][..., :k], out["share"][..., :k] = index, share
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("stored")
    bias = cable(N, H, T)
    summary = write_summary(d / "summary.h5", bias=bias, weights=weights_of(bias), resolution=T)
    with h5py.File(summary, "a") as f:
        g = f["layer_3"]
        g["diagnostics"][1] = (np.nan, 0.5, np.nan)  # head 2: two measures undefined
        g["sink_share"] = SINK_SHARE
        g["sink_share_se"] = np.array([0.01, 0.02, 0.03], np.float32)
        key_profile = np.zeros((2, H, T), np.float32)
        key_profile[0, :, 0] = KEY0
        g["weights_key_profile"] = key_profile
        # top keys of the mean: head 1 key 0; head 2 key 3 with 0.4 (a secondary sink); head 3 key 2 with 0.2 (none)
        g["sink_keys_of_mean"] = records([[0, 1], [3, 0], [2, -1]], [[0.5, 0.2], [0.4, 0.1], [0.2, 0.0]], (H, 8))
        # each sample's top key: head 1 always key 0; head 2 key 2 (0.5) in samples 0, 1 and key 5 (0.1) after;
        # head 3 key 1 (0.35) in samples 0..2 and key 0 in sample 3
        top = [[[0], [2], [1]], [[0], [2], [1]], [[0], [5], [1]], [[0], [5], [0]]]
        g["sink_keys"] = records(top, [[[0.9], [0.5], [0.35]]] * 2 + [[[0.9], [0.1], [0.35]], [[0.9], [0.1], [0.9]]],
                                 (N, H, 8))  # fmt: skip
        g["sink_keys"].attrs["sink_min_queries"] = 2
        g["attention_distance"] = np.array([[1.5, 2.0, np.nan], [0.5, 0.25, 0.0]], np.float32)
        g["attention_distance_se"] = np.array([0.1, 0.2, 0.3], np.float32)
        g["band_mass"] = np.stack([np.full((H, T), 0.1), np.zeros((H, T))]).astype(np.float32)  # 10 bins at T = 10
    few = write_summary(d / "few.h5", bias=bias[:2], weights=weights_of(bias[:2]), resolution=T)
    with h5py.File(few, "a") as f:
        f["layer_3/attention_distance"] = np.ones((2, H), np.float32)
        f["layer_3/sink_share"] = SINK_SHARE[:2]
        f["layer_3/weights_key_profile"] = np.zeros((2, H, T), np.float32)
        f["layer_3/sink_keys"] = records([[[0]] * H] * 2, [[[0.5]] * H] * 2, (2, H, 8))  # no sink_min_queries
    return {"summary": summary, "few": few,
            "sweep": write_summary(d / "sweep.h5", bias=bias, weights=weights_of(bias), resolution=5,
                                   steps=[0, 50, 100]),
            "full": write_full(d / "full.h5", "cable", bias, weights_of(bias)),
            "bias-only": write_summary(d / "bias-only.h5", bias=bias[:1], resolution=T, bias_only=True)}  # fmt: skip


def test_stored_heads_are_the_numbers_the_file_holds(files: dict[str, Path]) -> None:
    bias = cable(N, H, T)
    want = diagnostics(bias)  # what write_summary stored, by the definitions
    means = profile(bias)
    with open_bias_file(files["summary"]) as bf:
        heads = stored_heads(bf, 3)
    assert [h.head for h in heads] == [1, 2, 3] and {h.samples for h in heads} == {N}
    for k in (0, 2):
        assert heads[k].context_dependence == pytest.approx(want["context_dependence"][k], rel=1e-12)
        assert heads[k].toeplitz_residual == pytest.approx(want["toeplitz_residual"][k], rel=1e-12)
        assert heads[k].separability_residual == pytest.approx(want["separability_residual"][k], rel=1e-12)
        assert heads[k].notes == []
    undefined = heads[1]
    assert (undefined.context_dependence, undefined.toeplitz_residual, undefined.separability_residual) == (None, 0.5,
                                                                                                            None)
    assert heads[1].notes == ["head 2: context dependence is not defined (it needs at least 2 samples)",
                              "head 2: separability residual is not defined (the mean bias is constant)"]  # fmt: skip
    for h in range(H):
        np.testing.assert_allclose(heads[h].profile_mean, means[0, h], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(heads[h].profile_std, means[1, h], rtol=1e-6, atol=1e-6)


def test_the_sinks_are_counted_against_epsilon(files: dict[str, Path]) -> None:
    assert SINK_EPSILON == 0.3  # Gu et al. 2025
    with open_bias_file(files["summary"]) as bf:
        positional, sinks = stored_position(bf, 3)
    assert positional is None  # the file holds no positional logits
    assert sinks["epsilon"] == 0.3
    assert sinks["share_per_head"] == pytest.approx(KEY0)
    assert sinks["sink_heads_from_mean"] == pytest.approx(2 / 3)
    assert sinks["sink_heads_per_sample"] == pytest.approx(7 / 12)
    assert sinks["share_se_per_head"] == pytest.approx([0.01, 0.02, 0.03])
    assert sinks["sink_min_queries"] == 2
    assert sinks["top_keys_per_head"] == [
        [{"key": 0, "share": pytest.approx(0.5)}, {"key": 1, "share": pytest.approx(0.2)}],
        [{"key": 3, "share": pytest.approx(0.4)}, {"key": 0, "share": pytest.approx(0.1)}],
        [{"key": 2, "share": pytest.approx(0.2)}],  # the empty ranks (index -1) left out
    ]
    assert sinks["secondary_sink_heads"] == [1]  # indices from 0
    assert sinks["samples_with_secondary_sink_per_head"] == pytest.approx([0.0, 0.5, 0.75])
    assert "note" not in sinks


def test_sink_keys_ranked_before_the_rule_are_not_listed(files: dict[str, Path]) -> None:
    with open_bias_file(files["few"]) as bf:
        _, sinks = stored_position(bf, 3)
    assert "rank" in sinks["note"] and "extract it again" in sinks["note"]
    assert "top_keys_per_head" not in sinks and "secondary_sink_heads" not in sinks
    assert sinks["sink_heads_per_sample"] == pytest.approx(3 / 6)  # the first two samples of SINK_SHARE


def test_the_measures_are_listed_by_head_nan_as_null(files: dict[str, Path]) -> None:
    with open_bias_file(files["summary"]) as bf:
        doc = stored_measures(bf, 3)
    assert set(doc) == {"attention_distance", "band_mass", "distance_bins"}
    distance = doc["attention_distance"]
    assert distance["axis"] == "head"
    assert distance["mean"] == [1.5, 2.0, None] and distance["std"] == [0.5, 0.25, 0.0]
    assert distance["se"] == pytest.approx([0.1, 0.2, 0.3])
    band = doc["band_mass"]
    assert band["axis"] == "distance_bin" and "se" not in band
    assert np.array(band["mean"]) == pytest.approx(np.full((H, T), 0.1)) and np.array(band["std"]).shape == (H, T)
    assert doc["distance_bins"] == [[d, d] for d in range(T)]  # one bin per distance below 16
    assert "note" not in doc
    with open_bias_file(files["few"]) as bf:
        assert stored_measures(bf, 3)["note"] == "no standard errors: they need 3 samples or more"


def test_files_without_them_hold_no_position_and_no_measures(files: dict[str, Path]) -> None:
    for name in ("full", "bias-only", "sweep"):
        with open_bias_file(files[name]) as bf:
            assert stored_position(bf, 3) == (None, None), name
            assert stored_measures(bf, 3) is None, name


def test_a_sweep_is_read_checkpoint_by_checkpoint(files: dict[str, Path]) -> None:
    want = diagnostics(cable(N, H, T))
    with open_bias_file(files["sweep"]) as bf:
        sweep = stored_sweep(bf, 3)
    assert [step for step, _ in sweep] == [0, 50, 100]
    for _, heads in sweep:
        got = [h.toeplitz_residual for h in heads]
        assert got == pytest.approx(list(want["toeplitz_residual"]), rel=1e-12)
    with open_bias_file(files["summary"]) as bf, pytest.raises(ValueError, match="not a sweep file"):
        stored_sweep(bf, 3)
