"""Work that cannot fit is refused before it starts, with the size it would need: a summary's maps at a resolution
of 100,000 (terabytes of accumulators), a --bias-only summary over 3 * 10^11 positions (a distance table of
terabytes). Both used to ask the allocator for it and end in a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import TEXT, Case, checkpoint, run_case


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return checkpoint(tmp_path_factory.mktemp("sizes"), TEXT * 100)


CASES = [
    Case("--summary at resolution 100,000", "extract --model {ck} --text {text} --summary --seq-len 100000 "
         "--resolution 100000 --samples 1 --quiet --out {tmp}/o.h5",
         r"a summary of \d+ heads over 100000 positions in 100000 x 100000 blocks needs about [\d.]+ TiB"),
    Case("--bias-only summary over 3e11 positions", "extract --model {ck} --bias-only --scheme alibi "
         "--seq-len 300000000000 --resolution 64 --quiet --out {tmp}/o.h5",
         r"over 300000000000 positions in 64 x 64 blocks needs about [\d.]+ TiB"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_sizes_are_refused_before_the_work(case: Case, paths: dict[str, str], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: RuntimeError from the allocator (7.7 TB of maps; a 2.4 TB distance table), with a traceback."""
    run_case(case, paths, tmp_path, capsys)
