"""``biasviz info`` (:mod:`biasviz.cli.info_cmd`): the summary it prints, ``--json``'s attributes and layout (set
against what h5py reads of the file), every non-finite number spelled as text so that any JSON reader takes it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.cli.info_cmd import finite_json, layout
from tests.cli.test_cli_summary import H, N, R, T, files  # noqa: F401  (files: fixture)
from tests.conftest import run_cli
from tests.summary_files import cable, weights_of, write_summary


def test_info_says_what_a_summary_and_a_shared_file_hold(files: dict[str, Path],  # noqa: F811
                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, out, err = run_cli(["info", str(files["summary"])], capsys)
    assert code == 0, err
    assert "summary         yes (extract --summary): mean and std over 3 samples" in out
    assert "resolution      10: blocks of 5 x 5 positions" in out
    assert "layer_3/bias_mean       float32 (12, 10, 10)" in out and "layer_3/diagnostics     compound (12,)" in out
    code, out, err = run_cli(["info", "--json", str(files["summary"])], capsys)
    layout = json.loads(out)["biasviz_layout"]
    assert (layout["summary"], layout["resolution"], layout["block"], layout["samples"]) == (True, R, 5, N)
    assert layout["datasets"]["layer_3/weights_profile"] == {"shape": [2, H, T], "dtype": "float32"}
    code, out, err = run_cli(["info", str(files["shared"])], capsys)
    assert "layer_3/bias    float32" in out and "shared: one matrix for all 4 samples" in out
    code, out, err = run_cli(["info", "--json", str(files["shared"])], capsys)
    layout = json.loads(out)["biasviz_layout"]
    assert layout["bias_shared"] and layout["datasets"]["layer_3/bias"]["shape"] == [1, H, T, T]


def test_non_finite_numbers_become_the_text_python_prints() -> None:
    doc = {"a": math.nan, 1: [math.inf, -math.inf, (1.5, "x")], "b": {"c": 2, "d": None}}
    got = finite_json(doc)
    assert got == {"a": "nan", "1": ["inf", "-inf", [1.5, "x"]], "b": {"c": 2, "d": None}}
    assert json.loads(json.dumps(got, allow_nan=False)) == got


def held(path: Path) -> dict[str, dict[str, object]]:
    """Every dataset under a layer group, as h5py reads it."""
    found: dict[str, dict[str, object]] = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: found.update({name: {"shape": list(obj.shape), "dtype": "compound"
                                                            if obj.dtype.fields else str(obj.dtype)}})
                     if isinstance(obj, h5py.Dataset) and name.startswith("layer_") else None)  # fmt: skip
    return found


def test_the_layout_of_a_full_file_and_of_a_summary(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    full = make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=3, t=8, layers=(1, 3))
    got = layout(full)
    assert {k: v for k, v in got.items() if k != "datasets"} == {"summary": False, "samples": 2, "bias_shared": False,
                                                                 "bias_only": False, "seq_len": 8, "n_heads": 3}
    assert got["datasets"] == held(full)
    assert sorted(got["datasets"]) == ["layer_1/bias", "layer_1/weights", "layer_3/bias", "layer_3/weights"]
    bias = cable(3, 2, 10)
    summary = write_summary(tmp_path / "s.h5", bias=bias, weights=weights_of(bias), resolution=4)
    got = layout(summary)
    assert (got["summary"], got["samples"], got["resolution"], got["block"], got["blocks"]) == (True, 3, 4, 3, 4)
    assert got["datasets"] == held(summary)
    assert got["datasets"]["layer_3/diagnostics"] == {"shape": [2], "dtype": "compound"}


def test_json_holds_every_root_attribute(tmp_path: Path, make_bias_file: Callable[..., Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=2, t=8,
                          attrs={"config_json": json.dumps({"n_head": 2, "scheme": "alibi"}), "ratio": np.nan,
                                 "limits": np.array([1.0, np.inf])})  # fmt: skip
    code, out, err = run_cli(["info", "--json", str(path)], capsys)
    assert code == 0, err
    doc = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} is no JSON"))
    with h5py.File(path) as f:
        names = set(f.attrs)
        assert doc["scheme"] == f.attrs["scheme"] == "alibi" and doc["seq_len"] == int(f.attrs["seq_len"]) == 8
    assert set(doc) == names | {"biasviz_layout"}
    assert doc["config_json"] == {"n_head": 2, "scheme": "alibi"}  # read as the JSON it is
    assert doc["ratio"] == "nan" and doc["limits"] == [1.0, "inf"]
    assert doc["biasviz_layout"] == layout(path)
    with h5py.File(path, "a") as f:
        f.attrs["config_json"] = "{not json"
    code, out, _ = run_cli(["info", "--json", str(path)], capsys)
    assert code == 0 and json.loads(out)["config_json"] == "{not json"  # kept as the text stored


def test_the_summary_is_printed_inert_and_a_missing_file_is_one_error(
    tmp_path: Path, make_bias_file: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=2, t=8, attrs={"note": "red \x1b[31mtext"})
    code, out, err = run_cli(["info", str(path)], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"{path}  (biasviz format 1, ")
    assert "\x1b" not in out and "red \\x1b[31mtext" in out  # the escape shown as text, never sent
    code, out, err = run_cli(["info", str(tmp_path / "none.h5")], capsys)
    assert (code, out) == (1, "") and err == f"Error: {tmp_path / 'none.h5'} does not exist\n"
