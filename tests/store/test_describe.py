"""The text ``biasviz info`` prints (:mod:`biasviz.store.describe`): each line set against what the test wrote into
the file and what h5py reads back of it, long attributes cut to ``MAX_SHOWN`` characters, a sweep's notes shown as
recorded or, when they are not what extract writes, as they are."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.store.describe import dtype_name, summary
from tests.summary_files import cable, weights_of, write_summary

N, H, T = 3, 2, 12


def lines_of(text: str) -> dict[str, str]:
    """The summary's lines after the first, by their label: the text before the column of values, two spaces or more
    away (one after the longest dataset name)."""
    found = {}
    for line in text.splitlines()[1:]:
        parts = re.split(r" {2,}", line.strip(), maxsplit=1)
        label, value = parts if len(parts) == 2 else line.strip().split(" ", 1)
        found[label] = value
    return found


def test_a_full_file_is_described_line_by_line(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    long = "a  very\nlong   note " * 14  # 280 characters; 237 once each run of spaces or newlines is one space
    path = make_bias_file(tmp_path / "alibi.h5", "alibi", n=N, heads=H, t=T, layers=(1, 3),
                          attrs={"zz_note": long, "aa_extra": 7, "tokenizer": "gpt2"})  # fmt: skip
    text = summary(path)
    first = text.splitlines()[0]
    assert first == f"{path}  (biasviz format 1, {path.stat().st_size / 1e6:.1f} MB)"
    got = lines_of(text)
    assert got["scheme"] == "alibi (context-independent; bias convention: relative)"
    assert got["model"] == "synthetic"
    assert got["architecture"] == f"gpt2, 4 layers, {H} heads"
    assert got["model sha256"] == "0" * 64
    assert got["layers"] == "1, 3 (of 0..3)"
    assert got["shape"] == f"{N} samples x {H} heads x {T} queries x {T} keys"
    assert got["mask"] == "causal (cells after the query: bias NaN, weights 0)"
    assert got["inputs"] == "synthetic; seed 0; tokenizer gpt2"
    assert got["stored as"] == "float32"
    with h5py.File(path) as f:
        for layer in (1, 3):
            for kind in ("bias", "weights"):
                ds = f[f"layer_{layer}/{kind}"]
                assert (ds.compression, ds.compression_opts, ds.shuffle, ds.chunks) == ("gzip", 1, True, (1, 1, T, T))
                assert got[f"layer_{layer}/{kind}"] == f"float32, gzip level 1 + shuffle, chunks 1x1x{T}x{T}"
    other = [line for line in text.splitlines() if line.split()[0] in ("aa_extra", "zz_note")]
    assert [line.split()[0] for line in other] == ["aa_extra", "zz_note"]  # sorted by name
    assert other[0] == f"  {'aa_extra':<15} 7"
    collapsed = " ".join(long.split())
    assert len(collapsed) == 17 * 14 - 1 == 237
    assert other[1] == f"  {'zz_note':<15} {collapsed[:200]}... (237 characters)"


def test_a_summary_says_what_it_averages_and_lists_its_datasets(tmp_path: Path) -> None:
    bias = cable(N, H, T)
    path = write_summary(tmp_path / "cable.h5", bias=bias, weights=weights_of(bias), resolution=4)  # blocks of 3
    got = lines_of(summary(path))
    assert got["scheme"] == "cable (context-dependent; bias convention: relative)"
    assert got["summary"] == f"yes (extract --summary): mean and std over {N} samples; no per-sample matrices"
    assert got["resolution"] == "4: blocks of 3 x 3 positions"
    assert got["shape"] == f"{H} heads x 4 query blocks x 4 key blocks ({T} positions); profiles over {T} distances"
    with h5py.File(path) as f:
        names = sorted(f["layer_3"])
        assert names == ["bias_mean", "bias_profile", "bias_std", "diagnostics", "weights_mean", "weights_profile",
                         "weights_std"]  # fmt: skip
        assert f["layer_3/bias_mean"].compression is None
    assert sorted(k.removeprefix("layer_3/") for k in got if k.startswith("layer_3/")) == names
    assert got["layer_3/bias_mean"] == f"float32 ({H}, 4, 4) (head x query_block x key_block), uncompressed"
    assert got["layer_3/bias_profile"] == f"float32 (2, {H}, {T}) (stat x head x distance), uncompressed"
    assert got["layer_3/diagnostics"] == f"compound ({H},) (head), uncompressed"


@pytest.mark.parametrize(("attrs", "shown"), [
    ({"checkpoints_left_out": json.dumps({"75": "its weights could not be read"}),
      "checkpoints_identical": json.dumps([["0", "50"], ["100", "150", "200"]])},
     ["left out 75: its weights could not be read", "identical 0 = 50; 100 = 150 = 200 (byte-identical weights)"]),
    ({"checkpoints_left_out": "[1, 2", "checkpoints_identical": json.dumps({"0": "50"})},  # not what extract writes
     ["left out [1, 2", 'identical {"0": "50"}']),
])  # fmt: skip
def test_a_sweep_names_its_steps_and_its_notes(tmp_path: Path, attrs: dict[str, str], shown: list[str]) -> None:
    bias = cable(2, H, T)
    path = write_summary(tmp_path / "sweep.h5", bias=bias, weights=weights_of(bias), resolution=T, steps=[0, 50, 100],
                         attrs=attrs)  # fmt: skip
    text = summary(path)
    got = lines_of(text)
    assert got["checkpoints"] == "3 (training steps 0, 50, 100): a leading dimension of every layer dataset"
    assert got["resolution"] == f"{T}: exact per cell"
    assert got["layer_3/bias_mean"] == f"float32 (3, {H}, {T}, {T}) (checkpoint x head x query_block x key_block), " \
                                       "uncompressed"
    assert [f"left out {got['left out']}", f"identical {got['identical']}"] == shown


def test_a_compound_dataset_is_named_compound(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        records = f.create_dataset("r", shape=(2,), dtype=[("a", "f8"), ("b", "i4")])
        plain = f.create_dataset("p", data=np.zeros(2, np.float16))
        assert dtype_name(records) == "compound" and dtype_name(plain) == "float16"


@pytest.mark.parametrize(("recorded", "shown"), [
    (json.dumps(["m.layers.0.attn", "m.layers.0.attn", "m.layers.2.attn", ""]),  # as extract writes it
     "1: m.layers.0.attn; 3: the model's own forward (a layer is an attention call, in the order the model makes "
     "them)"),
    (json.dumps(["m.0", "m.1", "m.2", "m.3"]), "1: m.1; 3: m.3 (a layer is an attention call, in the order the model "
                                               "makes them)"),
    (json.dumps(["m.0", "m.1"]), '["m.0", "m.1"] (not a list of 4 module names)'),  # not one a layer
    (json.dumps({"1": "m.0"}), '{"1": "m.0"} (not a list of 4 module names)'),
    ("[not json", "[not json (not a list of 4 module names)"),
    (json.dumps(["m", 1, "m", "m"]), '["m", 1, "m", "m"] (not a list of 4 module names)'),
])  # fmt: skip
def test_a_traced_model_s_layers_say_which_module_made_each(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                             recorded: str, shown: str) -> None:  # fmt: skip
    """The module of each layer the file holds (1 and 3), runs of one module together; a value that is not what extract
    writes is shown as it is."""
    path = make_bias_file(tmp_path / "traced.h5", "alibi", n=N, heads=H, t=T, layers=(1, 3),
                          attrs={"call_modules": recorded})  # fmt: skip
    got = lines_of(summary(path))
    assert got["made by"] == shown
    assert "call_modules" not in got  # not again among the other attributes


def test_our_model_s_file_says_nothing_of_calls(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    assert "made by" not in lines_of(summary(make_bias_file(tmp_path / "a.h5", "alibi", n=N, heads=H, t=T)))
