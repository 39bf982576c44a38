"""A state dict's tensors must hold what their shapes declare before a model is built from them: a few bytes saved
with stride 0 can claim a width whose model takes tens of GiB."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hostile import TEXT, Case, run_case

WIDTH = 12 << 13  # n_embd claimed (12 heads of 8192): c_attn alone would be 3 * WIDTH^2 float32 values (108 GiB)


def _widened(tmp: Path, _paths: dict[str, str]) -> None:
    """A nanoGPT state dict of one layer whose every tensor is a stride-0 view of one value, at width 2^16."""
    from tests.cli.test_cli_errors import _state_dict

    small = _state_dict(vocab_size=300, n_layer=1)
    width = small["transformer.wte.weight"].shape[1]
    out = {}
    for key, t in small.items():
        shape = [WIDTH * (d // width) if d % width == 0 and d >= width else d for d in t.shape]
        out[key] = torch.zeros(1, dtype=t.dtype).expand(*shape) if t.dim() else t
    torch.save(out, tmp / "sd.pt")
    (tmp / "text.txt").write_text(TEXT)
    assert (tmp / "sd.pt").stat().st_size < 1 << 20


CASE = Case("stride-0 tensors claiming a huge width",
            "extract --model {tmp}/sd.pt --scheme alibi --text {tmp}/text.txt --seq-len 8 --samples 1 --quiet "
            "--out {tmp}/o.h5", r"sd\.pt is not a plain state dict: tensor '.*' declares shape .* \(a broadcast "
            "view\\)", prepare=_widened)  # fmt: skip


def test_a_state_dict_that_declares_more_than_it_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: the model was built to the claimed width (an allocation of tens of GiB)."""
    root = tmp_path / "shared"
    root.mkdir()
    tmp = tmp_path / "case"
    tmp.mkdir()
    run_case(CASE, {"root": str(root)}, tmp, capsys)
