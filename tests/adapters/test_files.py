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


@pytest.mark.parametrize(("value", "fine"), [
    (64, True), ([128, 128, 256], True), (0, False), ([128, 0], False), ([], False), ([128, "128"], False),
    ([128, [128]], False), (True, False), ([True], False), (2.0, False),
])  # fmt: skip
def test_a_size_is_an_integer_or_one_a_layer(tmp_path: Path, value: object, fine: bool) -> None:
    """A config may give a size per layer (Gemma 3n's ``intermediate_size``); each must still be an integer of at
    least 1."""
    from biasviz.adapters.files import check_config_sizes
    from biasviz.common.errors import BiasvizError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "intermediate_size": value}))
    if fine:
        check_config_sizes(tmp_path)
    else:
        with pytest.raises(BiasvizError, match="intermediate_size = .*an integer of at least 1"):
            check_config_sizes(tmp_path)


def test_a_checkpoint_with_sizes_per_layer_is_extracted(tmp_path: Path) -> None:
    """Gemma 3n's config.json gives ``intermediate_size`` one a layer: extracted, where it was refused as damaged;
    each call's weights are transformers' own eager ``output_attentions``."""
    import h5py
    import numpy as np
    from transformers import AutoConfig, AutoModelForCausalLM

    import biasviz

    config = AutoConfig.for_model("gemma3n_text", hidden_size=32, intermediate_size=[64, 64], num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=128,
                                  vocab_size_per_layer_input=128, hidden_size_per_layer_input=8,
                                  num_kv_shared_layers=0, layer_types=["sliding_attention", "full_attention"],
                                  laurel_rank=4, altup_num_inputs=2, activation_sparsity_pattern=[0.0, 0.0],
                                  sliding_window=8)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gemma3n")
    assert json.loads((tmp_path / "gemma3n" / "config.json").read_text())["intermediate_size"] == [64, 64]
    ids = np.random.default_rng(0).integers(3, 120, size=(2, 16))
    biasviz.extract(tmp_path / "gemma3n", ids, tmp_path / "g.h5", layers="all", progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "gemma3n", attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(torch.from_numpy(ids), output_attentions=True, use_cache=False).attentions
    with h5py.File(tmp_path / "g.h5") as f:
        for layer, expected in enumerate(want):
            np.testing.assert_allclose(f[f"layer_{layer}/weights"][...], expected.numpy(), atol=1e-5)
