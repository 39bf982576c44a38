"""Reading what checkpoints are made of (biasviz.adapters.files): safetensors headers that lie and pickles that
would run code are one error line, through ``biasviz extract`` on a saved transformers directory (the tiny random
GPT-2 of test_loading.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.adapters import test_loading
from tests.adapters.test_loading import _copy, _extract_args
from tests.conftest import run_cli

saved, text = test_loading.saved, test_loading.text  # the saved models and text of test_loading.py, this file's own


def _rewrite_header(directory: Path, change) -> None:
    file = directory / "model.safetensors"
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    change(header)
    text_bytes = json.dumps(header).encode()
    text_bytes += b" " * (-len(text_bytes) % 8)
    file.write_bytes(len(text_bytes).to_bytes(8, "little") + text_bytes + raw[8 + n :])



def _overlap(header: dict) -> None:
    names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    header[names[1]]["data_offsets"] = list(header[names[0]]["data_offsets"])



def _first_f32(header: dict) -> str:
    return next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")



def _label_f64(header: dict) -> None:
    header[_first_f32(header)]["dtype"] = "F64"



def _label_i32(header: dict) -> None:
    header[_first_f32(header)]["dtype"] = "I32"



@pytest.mark.parametrize(("change", "message"), [(_overlap, "not a valid safetensors file"),
                                                 (_label_f64, "not a valid safetensors file"),
                                                 (_label_i32, "label floating-point parameters as integers")])
def test_safetensors_that_lie_are_one_error_line(saved, text, tmp_path, capsys, change, message) -> None:
    target = _copy(saved["gpt2"], tmp_path / "lying")
    _rewrite_header(target, change)
    code, _, err = run_cli(_extract_args(target, text, tmp_path / "x.h5"), capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], err



class _RunsCode:
    def __reduce__(self) -> tuple:
        return (os.system, ("true",))



def test_a_pickle_that_would_run_code_is_refused(saved, text, tmp_path, capsys) -> None:
    from safetensors.torch import load_file

    target = _copy(saved["gpt2"], tmp_path / "pickled")
    state = load_file(str(target / "model.safetensors"))
    (target / "model.safetensors").unlink()
    torch.save({**state, "extra": _RunsCode()}, target / "pytorch_model.bin")
    code, _, err = run_cli(_extract_args(target, text, tmp_path / "x.h5"), capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("Error: refusing to load") and "pytorch_model.bin" in lines[0]
