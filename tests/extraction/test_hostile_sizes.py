"""Work that cannot fit is refused before it starts, with the size it would need: a summary's maps at a resolution
of 100,000 (terabytes of accumulators), a --bias-only summary over 3 * 10^11 positions (a distance table of
terabytes). Both used to ask the allocator for it and end in a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from biasviz.data import build_tokenizer, save_tokenizer
from tests.conftest import small_model
from tests.hostile import TEXT, Case, run_case


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sizes")
    small_model("alibi", vocab_size=300).save_pretrained(root / "ck")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "ck")
    (root / "long.txt").write_text(TEXT * 100)
    return {"root": str(root), "ck": str(root / "ck"), "text": str(root / "long.txt")}


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
