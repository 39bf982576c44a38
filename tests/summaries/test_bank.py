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
    # every sample at once, each its own (a spilled bank's reads share one buffer: each is copied before the next)
    assert torch.equal(bank.every(2, "k"), data)
    bank.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("budget", [0, 1 << 30])
def test_cells_kept_one_set_for_all_heads_or_one_a_head_read_back_for_every_head(tmp_path: Path, budget: int) -> None:
    """A sample whose heads attend cells of their own, after samples kept with one set for all heads: those are given
    to every head (the bank's array made anew, its memory counted once); a later one-for-all sample too."""
    gen = torch.Generator().manual_seed(1)
    heads, t = 3, 11  # 11 keys: two bytes a row, the last one part-filled
    cells = torch.rand(5, heads, t, t, generator=gen) > 0.5
    cells[:2] = cells[:2, :1]  # samples 0, 1 and 4: one set for all heads
    cells[4] = cells[4, :1]
    bank = SampleBank(5, device=torch.device("cpu"), budget=budget, directory=tmp_path)
    bank.put_cells(0, "attended", cells[:2, :1])
    assert bank.cell_heads(0, "attended") == 1
    assert torch.equal(bank.get_cells(0, "attended", 1, 2, 9, t), cells[1, :1, 2:9])
    bank.start = 2
    bank.put_cells(0, "attended", cells[2:4])
    bank.put_cells(0, "attended", cells[4:, :1], at=4)
    assert bank.cell_heads(0, "attended") == heads and bank.spilled == (budget == 0)
    assert bank.in_memory == (0 if budget == 0 else 5 * t * heads * 2)
    for a in range(5):
        for lo, hi, keys in ((0, t, t), (3, 7, 7), (10, 11, 11)):
            got = bank.get_cells(0, "attended", a, lo, hi, keys)
            assert torch.equal(got, cells[a, :, lo:hi, :keys]), (a, lo, hi)
    bank.close()
    assert bank.in_memory == 0 and not list(tmp_path.iterdir())
