"""Opening format-1 files (:mod:`biasviz.store.reader`): what is not a biasviz file of a known format is refused,
and so is a bias stored once (bias_shared) that holds more than one sample or belongs to a context-dependent scheme.

The second file is written with h5py (tests/summary_files.py), so the reader is held to the layout, not to biasviz's
own writer.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.store import open_bias_file
from tests.store.small_files import _write
from tests.summary_files import alibi, weights_of, write_full

H = 12  # the heads of the bias_shared files below


def test_reader_rejects_other_files(tmp_path):
    with pytest.raises(BiasvizError, match="does not exist"):
        open_bias_file(tmp_path / "none.h5")
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(BiasvizError, match="not a readable HDF5"):
        open_bias_file(tmp_path / "text.h5")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = 1
    with pytest.raises(BiasvizError, match="not a biasviz file"):
        open_bias_file(tmp_path / "other.h5")
    _write(tmp_path / "v2.h5")
    with h5py.File(tmp_path / "v2.h5", "a") as f:
        f.attrs["biasviz_format"] = 2
    with pytest.raises(BiasvizError, match="format 2"):
        open_bias_file(tmp_path / "v2.h5")


def test_a_shared_bias_must_hold_one_sample_and_a_context_free_scheme(tmp_path: Path) -> None:
    bias, weights = alibi(2, H, 16), weights_of(alibi(2, H, 16))
    wrong = write_full(tmp_path / "two.h5", "alibi", bias, weights, shared=True)
    with pytest.raises(BiasvizError, match=r"expected float \(1, 12, 16, 16\) \(one matrix for all samples"):
        open_bias_file(wrong)
    cable_file = write_full(tmp_path / "cable.h5", "cable", bias[:1], weights, shared=True)
    with pytest.raises(BiasvizError, match="bias_shared.*context-dependent"):
        open_bias_file(cable_file)
