"""A small file that declares huge datasets is refused before anything is read: HDF5 stores no chunk it was never
given, so a few KiB can declare a profile 2^31 distances long, and a reader that trusts the shape asks for
hundreds of GiB."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.hostile import Case, run_case
from tests.project.test_untrusted import write_valid
from tests.summary_files import cable, weights_of, write_summary

HUGE = 2**31


def _huge_summary(tmp: Path, _paths: dict[str, str]) -> None:
    """A valid summary at resolution 4, then made to declare 2^31 positions (no chunk written)."""
    bias = cable(2, 3, 8)
    path = write_summary(tmp / "x.h5", bias=bias, weights=weights_of(bias), resolution=4)
    block = HUGE // 4
    with h5py.File(path, "a") as f:
        f.attrs.update({"seq_len": HUGE, "block": block})
        del f["input_ids"]
        f.create_dataset("input_ids", shape=(2, HUGE), dtype=np.int32, chunks=(1, 1 << 16))
        for name in ("query_block", "key_block"):
            f[name][...] = np.arange(4) * block
        for kind in ("bias", "weights"):
            del f[f"layer_3/{kind}_profile"]
            f.create_dataset(f"layer_3/{kind}_profile", shape=(2, 3, HUGE), dtype=np.float32, chunks=(1, 1, 1 << 16))
    assert path.stat().st_size < 100_000


def _huge_extra(tmp: Path, _paths: dict[str, str]) -> None:
    """A valid full file with one more dataset declaring 2^40 values."""
    path = write_valid(tmp / "x.h5")
    with h5py.File(path, "a") as f:
        f.create_dataset("layer_1/extra", shape=(1 << 40,), dtype=np.float32, chunks=(1 << 16,))


DECLARED = r"'n_heads' \(3\) and 'seq_len' \(2147483648\) declare profiles of [\d.]+ GiB"
CASES = [
    Case("diagnose: a summary declaring 2^31 positions", "diagnose {tmp}/x.h5",
         DECLARED, prepare=_huge_summary, subprocess=True),
    Case("explore: a summary declaring 2^31 positions", "explore {tmp}/x.h5 --out {tmp}/x.html",
         DECLARED, prepare=_huge_summary, subprocess=True),
    Case("diagnose: a dataset declaring 2^40 values", "diagnose {tmp}/x.h5",
         r"'layer_1/extra' declares shape \(1099511627776,\).*TiB", prepare=_huge_extra, subprocess=True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_declared_sizes_are_checked_before_any_read(case: Case, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: diagnose and explore asked for the declared size (a MemoryError, or the machine's memory)."""
    root = tmp_path / "shared"
    root.mkdir()
    tmp = tmp_path / "case"
    tmp.mkdir()
    run_case(case, {"root": str(root)}, tmp, capsys)
