"""The Python API leaves the user's model as it found it: every submodule's own training flag, on success and
when the forward raises midway, for full extracts and summaries, traced modules and biasviz's own models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import biasviz
from biasviz.common.errors import BiasvizError
from tests import nano_gpt
from tests.conftest import small_model


def _mixed(model: torch.nn.Module) -> dict[str, bool]:
    """Train mode, with every second submodule put in eval mode as a user might (a frozen part): the flags."""
    model.train()
    for k, (_, m) in enumerate(model.named_modules()):
        if k % 2:
            m.eval()
    flags = {name: m.training for name, m in model.named_modules()}
    assert len(set(flags.values())) == 2  # both modes present: a model.train(True) at the end would show
    return flags


def _flags(model: torch.nn.Module) -> dict[str, bool]:
    return {name: m.training for name, m in model.named_modules()}


MODELS = {"traced": lambda: nano_gpt.pair()[0], "ours": lambda: small_model("alibi")}


@pytest.mark.parametrize("summary", [False, True])
@pytest.mark.parametrize("which", list(MODELS))
def test_every_submodules_training_flag_is_restored(tmp_path: Path, which: str, summary: bool) -> None:
    model = MODELS[which]()
    before = _mixed(model)
    ids = torch.randint(0, 90, (2, 16), generator=torch.Generator().manual_seed(0))
    biasviz.extract(model, ids, tmp_path / "a.h5", device="cpu", summary=summary, progress=False)
    assert _flags(model) == before


class _Fails(Exception):
    pass


@pytest.mark.parametrize("summary", [False, True])
@pytest.mark.parametrize("which", list(MODELS))
def test_the_flags_are_restored_when_the_forward_raises_midway(tmp_path: Path, which: str, summary: bool) -> None:
    model = MODELS[which]()
    before = _mixed(model)
    calls = []

    def second_batch_fails(module: torch.nn.Module, args: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise _Fails("out of memory, say")

    handle = model.register_forward_pre_hook(second_batch_fails)
    ids = torch.randint(0, 90, (3, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises((_Fails, BiasvizError)):
        biasviz.extract(model, ids, tmp_path / "a.h5", device="cpu", summary=summary, progress=False)
    handle.remove()
    assert len(calls) == 2  # the forward ran, and raised in the second batch
    assert _flags(model) == before
    assert not (tmp_path / "a.h5").exists()


@pytest.mark.parametrize("which", list(MODELS))
@pytest.mark.parametrize("summary", [False, True])
def test_a_model_on_the_meta_device_is_one_error_naming_a_weight(tmp_path: Path, which: str, summary: bool) -> None:
    with torch.device("meta"):
        model = MODELS[which]()
    ids = torch.zeros(2, 16, dtype=torch.long)
    with pytest.raises(BiasvizError, match=r"weight '[\w.]+' is on the meta device .*load its weights"):
        biasviz.extract(model, ids, tmp_path / "a.h5", device="cpu", summary=summary, progress=False)
    assert not list(tmp_path.iterdir())


def test_the_command_line_names_a_meta_weight_in_a_users_factory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import run_cli

    code = tmp_path / "m.py"
    code.write_text("import torch\nfrom torch import nn\n\n\ndef build():\n    with torch.device('meta'):\n"
                    "        return nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))\n")  # fmt: skip
    (tmp_path / "t.txt").write_text("abc " * 200)
    status, _, err = run_cli(["extract", "--model", f"{code}:build", "--text", str(tmp_path / "t.txt"),
                              "--seq-len", "8", "--out", str(tmp_path / "o.h5")], capsys)  # fmt: skip
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 1 and len(lines) == 1 and "meta device" in lines[0] and lines[0].startswith("Error:"), err
    assert not (tmp_path / "o.h5").exists()
