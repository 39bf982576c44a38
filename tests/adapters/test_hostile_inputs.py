"""Inputs that a library would answer with a traceback are one clear error at biasviz's boundary: token ids of
different lengths (numpy's ValueError), ids on the meta device, a config.json with 0 attention heads
(ZeroDivisionError as transformers builds the model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import biasviz
from biasviz.common.errors import BiasvizError
from tests.conftest import small_model
from tests.hostile import TEXT, Case, limited, run_case


@pytest.mark.parametrize(("ids", "said"), [
    ([[1, 2, 3, 4], [1, 2]], "one length per sample"),
    (torch.zeros(2, 8, dtype=torch.long, device="meta"), "meta device"),
], ids=["ragged", "meta"])  # fmt: skip
def test_ids_that_are_no_array_are_one_error(ids: object, said: str, tmp_path: Path) -> None:
    """Old code: numpy's ValueError (ragged) and torch's NotImplementedError (meta) from inside extract."""
    with limited(), pytest.raises(BiasvizError, match=said):
        biasviz.extract(small_model("alibi"), ids, tmp_path / "x.h5", device="cpu", progress=False)
    assert not (tmp_path / "x.h5").exists()


def _no_heads(tmp: Path, _paths: dict[str, str]) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=300, n_positions=64)).save_pretrained(
        tmp / "g2")
    config = json.loads((tmp / "g2" / "config.json").read_text())
    config["n_head"] = 0
    (tmp / "g2" / "config.json").write_text(json.dumps(config))
    (tmp / "text.txt").write_text(TEXT)


def test_a_config_with_no_heads_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: ZeroDivisionError with a traceback as transformers built the model."""
    root = tmp_path / "shared"
    root.mkdir()
    tmp = tmp_path / "case"
    tmp.mkdir()
    case = Case("n_head = 0", "extract --model {tmp}/g2 --text {tmp}/text.txt --seq-len 8 --samples 1 --quiet "
                "--out {tmp}/o.h5", r"config\.json: n_head = 0, where a model needs an integer of at least 1",
                prepare=_no_heads)  # fmt: skip
    run_case(case, {"root": str(root)}, tmp, capsys)
