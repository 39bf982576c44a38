"""Work that cannot fit is refused before it starts (:mod:`biasviz.common.memory`): sizes in binary units, the
machine's memory read as the kernel reports it, a process limit lowering the budget, and the refusals at exactly
the sizes worked out by hand."""

from __future__ import annotations

import os
import resource
from types import SimpleNamespace

import pytest

import biasviz.common.memory as memory
from biasviz.common.errors import BiasvizError


@pytest.mark.parametrize(("n", "want"), [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (5 * 2**20, "5.0 MiB"), (3 * 2**30, "3.0 GiB"), (int(7.3 * 2**40), "7.3 TiB"), (2**50, "1.0 PiB"),
    (2**60, "1024.0 PiB"),  # nothing above PiB: the count grows
])  # fmt: skip
def test_size_text_is_binary_units(n: int, want: str) -> None:
    assert memory.size_text(n) == want


def test_attention_bytes_is_float32_batch_heads_t_t() -> None:
    assert memory.attention_bytes(2, 12, 64) == 2 * 12 * 64 * 64 * 4 == 393_216
    assert memory.attention_bytes(2, 12, 64, matrices=3) == 3 * 393_216


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads Linux's /proc/meminfo")
def test_the_machines_memory_is_its_ram_and_swap() -> None:
    """RAM from sysconf and swap from /proc/meminfo (kB), read here independently."""
    with open("/proc/meminfo", encoding="ascii") as f:
        fields = dict(line.split(":", 1) for line in f)
    swap = int(fields["SwapTotal"].split()[0]) * 1024
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory.memory_of() == memory.memory_of(SimpleNamespace(type="cpu")) == ram + swap


def test_a_process_limit_below_the_machines_memory_is_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """ulimit -v (RLIMIT_AS) or -d (RLIMIT_DATA): the smallest of the limits and the machine's memory."""
    limits = {resource.RLIMIT_AS: (5000, resource.RLIM_INFINITY), resource.RLIMIT_DATA: (7000, 7000)}
    monkeypatch.setattr(memory, "memory_of", lambda device=None: 10_000)
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits[which])
    assert memory.memory_budget() == 5000
    limits[resource.RLIMIT_AS] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert memory.memory_budget() == 7000
    limits[resource.RLIMIT_DATA] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert memory.memory_budget() == 10_000
    monkeypatch.setattr(memory, "memory_of", lambda device=None: None)
    assert memory.memory_budget() is None  # nothing known: no budget, not 0


def test_check_fits_refuses_only_more_than_there_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "memory_of", lambda device=None: 2048)
    memory.check_fits(2048, "the work", "do less")  # exactly all of it: let through (the estimate is a lower bound)
    with pytest.raises(BiasvizError) as refused:
        memory.check_fits(3072, "the work", "do less")
    assert str(refused.value) == ("the work needs about 3.0 KiB of memory, more than the 2.0 KiB this machine has; "
                                  "do less")  # fmt: skip
    with pytest.raises(BiasvizError, match="more than the 2.0 KiB the GPU has"):
        memory.check_fits(3072, "the work", "do less", device=SimpleNamespace(type="cuda"))


def test_check_fits_counts_a_limit_on_the_process_below_the_machines_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster's job (ulimit -v, a scheduler's h_vmem) may use less than the machine has: what does not fit there is
    refused before it starts too, the limit named; a GPU's own memory is what counts on a GPU."""
    limits = {resource.RLIMIT_AS: (5000, resource.RLIM_INFINITY),
              resource.RLIMIT_DATA: (resource.RLIM_INFINITY, resource.RLIM_INFINITY)}  # fmt: skip
    monkeypatch.setattr(memory, "memory_of", lambda device=None: 10_000)
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits[which])
    memory.check_fits(5000, "the work", "do less")
    with pytest.raises(BiasvizError) as refused:
        memory.check_fits(6000, "the work", "do less")
    assert str(refused.value) == ("the work needs about 5.9 KiB of memory, more than the 4.9 KiB this process may use "
                                  "(its limit: ulimit -v or -d, or a job scheduler's); do less")  # fmt: skip
    memory.check_fits(6000, "the work", "do less", device=SimpleNamespace(type="cuda"))  # the GPU's 10,000 bytes


def test_check_fits_lets_everything_through_where_the_memory_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "memory_of", lambda device=None: None)
    memory.check_fits(2**80, "the work", "do less")


def test_a_summarys_accumulators_are_counted_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 heads, 10 positions in blocks of 3: 4 x 4 blocks (the last one short). float64 sum and sum of squares:
    maps 2*8*2*16 = 512, profiles 2*8*2*2*10 = 640, the table by distance 8*10 = 80; 1232 bytes in all."""
    monkeypatch.setattr(memory, "memory_of", lambda device=None: 1232)
    memory.check_summary_memory(2, 10, 3)
    monkeypatch.setattr(memory, "memory_of", lambda device=None: 1231)
    with pytest.raises(BiasvizError, match=r"a summary of 2 heads over 10 positions in 4 x 4 blocks needs about "
                                           r"1\.2 KiB .* use a smaller --resolution or a shorter --seq-len"):
        memory.check_summary_memory(2, 10, 3)
