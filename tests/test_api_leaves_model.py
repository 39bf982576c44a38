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
