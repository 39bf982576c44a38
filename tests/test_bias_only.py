"""extract --bias-only: a context-free scheme's bias with no text and no forward pass."""

from __future__ import annotations

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


def test_alibi_at_4096_is_minus_slope_times_distance(checkpoints, tmp_path, capsys) -> None:
    out = tmp_path / "a.h5"
    code, stdout, err = run_cli(["extract", "--model", str(checkpoints / "alibi"), "--bias-only", "--seq-len", "4096",
                                 "--out", str(out), "--device", "cpu"], capsys)  # fmt: skip
    assert code == 0, err
    with open_bias_file(out) as f:
        assert f.bias_only and f.n_samples == 1 and f.seq_len == 4096
        assert (f.input_ids() == -1).all()  # no token was read
        i = np.arange(4096)
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
