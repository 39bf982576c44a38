"""The bank of samples' rows, in memory or spilled to disk (:mod:`biasviz.summaries.bank`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from biasviz.summaries.bank import SampleBank


@pytest.mark.parametrize("short_io", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("budget", [0, 1 << 30])
def test_the_bank_reads_back_every_sample_and_range_exactly(
    tmp_path: Path, dtype: torch.dtype, budget: int, short_io: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``short_io``: the system moves a few bytes a call (Linux moves at most about 2 GiB): the bank goes on."""
    if short_io:
        pwrite, preadv = os.pwrite, os.preadv
        monkeypatch.setattr(os, "pwrite", lambda fd, data, at: pwrite(fd, memoryview(data)[:11], at))
        monkeypatch.setattr(os, "preadv", lambda fd, into, at: preadv(fd, [memoryview(into[0])[:13]], at))
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(7, 30, 5, generator=gen).to(dtype)  # (samples, T, F)
    bank = SampleBank(7, device=torch.device("cpu"), budget=budget, directory=tmp_path)
    for start, stop in ((0, 3), (3, 4), (4, 7)):
        bank.start = start
        bank.put(2, "k", data[start:stop])
    assert bank.spilled == (budget == 0) and bank.seq_len(2, "k") == 30
    for sample in range(7):
        for lo, hi in ((0, 30), (4, 9), (29, 30)):
            got = bank.get(2, "k", sample, lo, hi)
            assert got.dtype == dtype and torch.equal(got, data[sample, lo:hi])
    bank.close()
    assert not list(tmp_path.iterdir())
