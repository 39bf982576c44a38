"""extract --bias-only: a context-free scheme's bias with no text and no forward pass."""

from __future__ import annotations

import warnings

import h5py
import numpy as np
import pytest

from biasviz.store import open_bias_file
from tests.conftest import run_cli, small_model

H = 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("bo")
    for scheme in ("alibi", "cable", "learned"):
        small_model(scheme).save_pretrained(root / scheme)
    return root


def test_alibi_at_2048_is_minus_slope_times_distance(checkpoints, tmp_path, capsys) -> None:
    out = tmp_path / "a.h5"
    code, stdout, err = run_cli(["extract", "--model", str(checkpoints / "alibi"), "--bias-only", "--seq-len", "2048",
                                 "--out", str(out), "--device", "cpu"], capsys)  # fmt: skip
    assert code == 0, err
    with open_bias_file(out) as f:
        assert f.bias_only and f.n_samples == 1 and f.seq_len == 2048
        assert (f.input_ids() == -1).all()  # no token was read
        i = np.arange(2048)
        d = (i[:, None] - i[None, :]).astype(np.float64)
        lower = d >= 0
        for h in (0, 5, 11):  # m_h = 2^(-8 h / 12), heads from 1
            b = f.read("bias", sample=0)[h].astype(np.float64)
            np.testing.assert_allclose(b[lower], -(2.0 ** (-8.0 * (h + 1) / H)) * d[lower], rtol=1e-6, atol=1e-4)
            assert np.isnan(b[~lower]).all()
        with pytest.raises(Exception, match="bias only"):
            f.read("weights")
    with h5py.File(out, "r") as raw:
        assert set(raw["layer_1"]) == {"bias"} and bool(raw.attrs["bias_only"])
    code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(out), "--kind", "weights",
                            "--out-dir", str(tmp_path / "figs")], capsys)  # fmt: skip
    assert code == 1 and "bias only" in err
    code, _, _ = run_cli(["plot", "--scheme", "alibi", "--input", str(out), "--kind", "all", "--format", "png",
                          "--out-dir", str(tmp_path / "figs")], capsys)  # fmt: skip
    assert code == 0 and sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["alibi_bias.png"]
    code, stdout, _ = run_cli(["info", str(out)], capsys)
    assert code == 0 and "no text" in stdout


@pytest.mark.parametrize(("scheme", "message"), [("cable", "depends on the input"), ("learned", "adds no bias")])
def test_schemes_without_a_context_free_bias_are_refused(checkpoints, tmp_path, capsys, scheme, message) -> None:
    out = tmp_path / "x.h5"
    code, _, err = run_cli(["extract", "--model", str(checkpoints / scheme), "--bias-only", "--seq-len", "32",
                            "--out", str(out), "--device", "cpu"], capsys)  # fmt: skip
    assert code == 1 and err.startswith("Error:") and message in err and not out.exists()


@pytest.mark.parametrize(("seq_len", "resolution"), [(4096, 64), (300, 300), (1000, 7)])
def test_alibi_summary_at_any_length_is_the_block_mean_of_minus_slope_times_distance(
    checkpoints, tmp_path, capsys, seq_len: int, resolution: int
) -> None:
    """--bias-only --resolution: the maps, profile and diagnostics of -m_h (i - j), against plain numpy."""
    out = tmp_path / "a.h5"
    code, stdout, err = run_cli(["extract", "--model", str(checkpoints / "alibi"), "--bias-only", "--seq-len",
                                 str(seq_len), "--resolution", str(resolution), "--out", str(out), "--device", "cpu"],
                                capsys)  # fmt: skip
    assert code == 0, err
    b = -(-seq_len // resolution)
    with h5py.File(out, "r") as f:
        assert bool(f.attrs["summary"]) and f.attrs["samples"] == 0 and f.attrs["block"] == b
        assert set(f["layer_1"]) == {"bias_mean", "bias_std", "bias_profile", "diagnostics"}
        mean, prof, diag = f["layer_1/bias_mean"][()], f["layer_1/bias_profile"][()], f["layer_1/diagnostics"][()]
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    d = np.arange(seq_len)
    np.testing.assert_allclose(prof[0], -slopes[:, None] * d, rtol=1e-6, atol=1e-4)
    assert (prof[1] == 0).all()
    # block (q, k): mean of i - j over its cells j <= i, by brute force on a few blocks
    nb = mean.shape[-1]
    for q, k in [(0, 0), (nb - 1, 0), (nb - 1, nb - 1), (nb // 2, nb // 3)]:
        i, j = np.meshgrid(np.arange(q * b, min(seq_len, q * b + b)), np.arange(k * b, min(seq_len, k * b + b)),
                           indexing="ij")  # fmt: skip
        used = j <= i
        np.testing.assert_allclose(mean[:, q, k], -slopes * (i - j)[used].mean(), rtol=1e-6)
    assert np.isnan(mean[:, 0, nb - 1]).all() if nb > 1 else True  # above the diagonal: no cell
    assert (diag["toeplitz_residual"] == 0).all() and np.isnan(diag["context_dependence"]).all()
    assert (np.abs(diag["separability_residual"]) < 1e-6).all()  # -m (i - j) = s_i - s_j exactly


def test_fire_summary_streams_row_blocks_and_equals_the_full_bias(checkpoints, tmp_path, capsys) -> None:
    """A context-free bias that is not a function of i - j alone (FIRE): formed in row blocks, pooled."""
    from tests.conftest import small_model as build

    build("fire").save_pretrained(tmp_path / "fire")
    full, summ = tmp_path / "full.h5", tmp_path / "sum.h5"
    base = ["extract", "--model", str(tmp_path / "fire"), "--bias-only", "--seq-len", "96", "--device", "cpu"]
    assert run_cli([*base, "--out", str(full)], capsys)[0] == 0
    assert run_cli([*base, "--resolution", "32", "--out", str(summ)], capsys)[0] == 0
    with h5py.File(full, "r") as f, h5py.File(summ, "r") as s:
        cells = f["layer_1/bias"][0].astype(np.float64)  # (H, T, T), NaN above the diagonal
        with warnings.catch_warnings():  # blocks above the diagonal hold no cell: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            blocks = np.nanmean(cells.reshape(H, 32, 3, 32, 3), axis=(2, 4))
        np.testing.assert_allclose(s["layer_1/bias_mean"][()], blocks, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("args", "message"), [
    (["--resolution", "0"], "--resolution must be"),
])  # fmt: skip
def test_bad_resolutions_are_one_error_line(checkpoints, tmp_path, capsys, args, message) -> None:
    out = tmp_path / "x.h5"
    code, _, err = run_cli(["extract", "--model", str(checkpoints / "alibi"), "--bias-only", "--seq-len", "32",
                            *args, "--out", str(out), "--device", "cpu"], capsys)  # fmt: skip
    assert code == 1 and err.startswith("Error:") and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
