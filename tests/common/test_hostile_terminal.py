"""Text from a file reaches the terminal inert: an attribute holding ESC or BEL sequences (which retitle the
window, clear the screen, hide text) or a bidirectional override is printed escaped, by ``info`` and in the one
``Error:`` line alike."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

from tests.hostile import Case, run, run_case
from tests.project.test_untrusted import write_valid

CONTROLS = "\x1b]0;owned\x07\x1b[2J\x1b[31m\u202e\x9b"


def controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (its line breaks aside)."""
    return [c for c in text.replace("\n", "") if not c.isprintable()]


def crafted(path: Path, **attrs: object) -> Path:
    write_valid(path)
    with h5py.File(path, "a") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
    return path


def test_info_prints_attributes_inert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: ``info`` printed source_model, scheme and an unknown attribute's key and value raw."""
    f = crafted(tmp_path / "x.h5", source_model=f"gpt{CONTROLS}", scheme=f"alibi{CONTROLS}",
                **{f"note{CONTROLS}": f"v{CONTROLS}"})  # fmt: skip
    code, out, err = run(["info", str(f)], capsys, in_subprocess=True, cwd=tmp_path)
    assert code == 0, err
    assert controls(out) == [] and controls(err) == [], (out, err)
    assert "gpt\\x1b]0;owned\\x07" in out  # shown, escaped, not dropped


def _bad_heads(tmp: Path, _paths: dict[str, str]) -> None:
    crafted(tmp / "x.h5", n_heads=f"3{CONTROLS}")


def _missing(tmp: Path, _paths: dict[str, str]) -> None:
    pass


CASES = [
    Case("an attribute's text in the Error line", "info {tmp}/x.h5", r"n_heads.*\\x1b\[2J", prepare=_bad_heads,
         subprocess=True),
    Case("a file name with controls in the Error line", f"info {{tmp}}/y{CONTROLS[:8]}.h5", r"y\\x1b\]0;owne\.h5",
         prepare=_missing),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_error_lines_are_inert(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: the Error line carried the ESC and BEL bytes as they were."""
    root = tmp_path / "shared"
    root.mkdir()
    tmp = tmp_path / "case"
    tmp.mkdir()
    _code, _out, err = run_case(case, {"root": str(root)}, tmp, capsys)
    assert controls(err) == [], err


def test_a_views_repr_is_inert(tmp_path: Path) -> None:
    """``biasviz.open(path)`` shown at a Python prompt prints info's text: old code carried ESC and BEL raw."""
    import biasviz
    from tests.hostile import limited

    f = crafted(tmp_path / "x.h5", source_model=f"gpt{CONTROLS}")
    with limited(), biasviz.open(f) as view:
        text = repr(view)
    assert controls(text) == [] and "gpt\\x1b]0;owned\\x07" in text
