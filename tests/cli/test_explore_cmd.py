"""``biasviz explore`` (:mod:`biasviz.cli.explore_cmd`): where the page goes, the options handed to the page, and the
command's errors (one line each; an existing page kept without --force, an input never overwritten). What the page
holds is tests/explorer's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.explorer.test_build import page_payload


def test_errors_are_one_line_and_an_existing_page_is_kept(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    bogus = tmp_path / "notes.h5"
    bogus.write_text("not hdf5")
    src = make_bias_file(tmp_path / "alibi.h5")
    out = tmp_path / "p.html"
    cases = [
        ["explore", str(bogus), "--out", str(out)],
        ["explore", str(src), "--layer", "7", "--out", str(out)],
        ["explore", str(tmp_path / "missing.h5"), "--out", str(out)],
    ]
    for args in cases:
        code, _, err = run_cli(args, capsys)
        assert code == 1 and err.startswith("Error:") and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err
    assert not out.exists()
    out.write_text("keep me")
    code, _, err = run_cli(["explore", str(src), "--out", str(out)], capsys)
    assert code == 1 and "--force" in err and out.read_text() == "keep me"
    code, _, err = run_cli(["explore", str(src), "--out", str(out), "--force"], capsys)
    assert code == 0 and out.read_text().startswith("<!DOCTYPE html>")
    code, _, err = run_cli(["explore", str(src), str(src), str(src)], capsys)
    assert code == 2 and err.startswith("Error:")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_the_page_is_named_for_its_files_in_figures(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=2, t=8)
    make_bias_file(tmp_path / "b.h5", "cable", n=2, heads=2, t=8)
    code, out, err = run_cli(["explore", "a.h5"], capsys)
    assert code == 0, err
    page = tmp_path / "figures" / "a_explore.html"
    assert out.startswith(f"wrote figures/a_explore.html ({page.stat().st_size / 1e6:.1f} MB; ")
    assert len(out.splitlines()) == 1
    code, out, err = run_cli(["explore", "a.h5", "b.h5"], capsys)
    assert code == 0, err
    assert out.startswith("wrote figures/a_vs_b_explore.html (")
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["a_explore.html", "a_vs_b_explore.html"]


def test_kind_and_layer_reach_the_page(tmp_path: Path, make_bias_file: Callable[..., Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    src = make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=2, t=8, layers=(1, 3))
    out = tmp_path / "p.html"
    code, _, err = run_cli(["explore", str(src), "--kind", "weights", "--layer", "1", "--out", str(out)], capsys)
    assert code == 0, err
    payload = page_payload(out.read_text())
    assert payload["kinds"] == ["weights"]
    assert {key.split("|")[1:3] == ["1", "weights"] for key in payload["sets"]} == {True}


def test_an_input_is_never_the_page_and_a_folder_is_no_page(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    src = make_bias_file(tmp_path / "a.h5", "alibi", n=1, heads=1, t=4)
    before = src.read_bytes()
    code, _, err = run_cli(["explore", str(src), "--out", str(src), "--force"], capsys)
    assert code == 1 and "is one of the input files" in err and len(err.strip().splitlines()) == 1
    assert src.read_bytes() == before
    code, _, err = run_cli(["explore", str(src), "--out", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err  # click refuses it before the command runs
    code, _, err = run_cli(["explore", str(src), "--max-mb", "0.4", "--out", str(tmp_path / "p.html")], capsys)
    assert code == 2 and "--max-mb" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5"]
