"""The user's own model code (:mod:`biasviz.adapters.factory`): ``--model code.py:FACTORY`` names code and a factory,
the code is imported as its own (its neighbours importable, ``sys.path`` left as it was), the factory gets the
checkpoint, and whatever the code raises, at import, in the factory or in a forward, becomes one error that says
where it came from. Through the CLI: the model it builds traced against nanoGPT's explicit path (tests/nano_gpt.py)."""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import h5py
import pytest
import torch

from biasviz.adapters.factory import is_factory_spec, load_factory, users_code
from biasviz.common.errors import BiasvizError
from biasviz.tracing.stop import StopForward
from tests import nano_gpt
from tests.conftest import run_cli
from tests.tracing.test_calls import close


# --- through the CLI ----------------------------------------------------------------------------------------------
def test_cli_extracts_from_code_and_factory_with_a_checkpoint(tmp_path, capsys) -> None:
    torch.manual_seed(7)
    other = nano_gpt.GPT(nano_gpt.GPTConfig(vocab_size=300), flash=True)
    code = tmp_path / "mine.py"
    code.write_text("import torch\nfrom tests.nano_gpt import GPT, GPTConfig\n\n"
                    "def build(checkpoint=None):\n    model = GPT(GPTConfig(vocab_size=300))\n"
                    "    if checkpoint:\n        model.load_state_dict(torch.load(checkpoint, weights_only=True))\n"
                    "    return model\n")  # fmt: skip
    torch.save(other.state_dict(), tmp_path / "ckpt.pt")
    out = tmp_path / "mine.h5"
    code_rc, _, err = run_cli(["extract", "--model", f"{code}:build", "--checkpoint", str(tmp_path / "ckpt.pt"),
                               "--samples", "2", "--seq-len", "32", "--layer", "all", "--out", str(out),
                               "--quiet"], capsys)  # fmt: skip
    assert code_rc == 0, err
    explicit = nano_gpt.GPT(nano_gpt.GPTConfig(vocab_size=300), flash=False).eval()
    explicit.load_state_dict(other.state_dict())
    with h5py.File(out) as f:
        ids = torch.from_numpy(f["input_ids"][:]).long()
        assert f.attrs["source_model"].endswith("(" + str((tmp_path / "ckpt.pt").resolve()) + ")")
        with torch.no_grad():
            explicit(ids)
        for layer in range(3):
            assert close(torch.from_numpy(f[f"layer_{layer}/weights"][:]), explicit.transformer.h[layer].attn.last_att)


@pytest.mark.parametrize(("spec", "extra", "message"), [
    ("{tmp}/missing.py:make", [], "is not a file"),
    ("{tmp}/broken.py:make", [], "importing broken.py failed: ZeroDivisionError"),
    ("{tmp}/ok.py:absent", [], "defines no callable 'absent'"),
    ("{tmp}/ok.py:not_a_module", [], "returned a int, not a torch.nn.Module"),
    ("{tmp}/ok.py:raises", [], r"raises\(\) failed: RuntimeError: no weights"),
    ("{tmp}/ok.py:make", ["--no-scale"], "--no-scale does not apply"),
    ("{tmp}/ok.py:make", ["--bias-only"], "--bias-only: the bias of a traced model"),
])  # fmt: skip
def test_cli_factory_errors(tmp_path, capsys, spec: str, extra: list[str], message: str) -> None:
    (tmp_path / "broken.py").write_text("1 / 0\n")
    (tmp_path / "ok.py").write_text("from tests.nano_gpt import make\n\ndef not_a_module():\n    return 3\n\n"
                                    "def raises():\n    raise RuntimeError('no weights')\n")  # fmt: skip
    out = tmp_path / "o.h5"
    rc, _, err = run_cli(["extract", "--model", spec.format(tmp=tmp_path), *extra, "--seq-len", "16",
                          "--samples", "1", "--out", str(out), "--quiet"], capsys)  # fmt: skip
    lines = err.strip().splitlines()
    assert rc in (1, 2) and len(lines) == 1 and lines[0].startswith("Error:") and re.search(message, lines[0]), err
    assert not out.exists()


# --- naming code and a factory ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "named"), [
    ("code.py:make", True), ("dir/my code.py:Make_2", True), ("C:/models/code.py:make", True), ("a:b.py:make", True),
    (Path("code.py"), False), ("code.py:", False), ("code.py:2make", False), ("code.py:make.me", False),
    ("code.txt:make", False), ("model.pt", False), ("checkpoints/run:1", False), (":make", False),
])  # fmt: skip
def test_a_spec_names_python_code_and_a_factory(spec: str | Path, named: bool) -> None:
    assert is_factory_spec(spec) is named


# --- what the user's code raises ---------------------------------------------------------------------------------
def test_what_the_users_code_raises_becomes_one_error_that_says_so() -> None:
    with pytest.raises(BiasvizError) as raised, users_code("m.py:make", "make()"):
        raise ValueError("first line\nsecond line")
    assert str(raised.value) == ("--model m.py:make: make() failed: ValueError: first line; the error came from your "
                                 "code (biasviz --debug shows the traceback)")  # fmt: skip
    assert type(raised.value.__cause__) is ValueError
    with pytest.raises(BiasvizError, match=r"^--model m\.py:make: make\(\) failed: KeyError; the error came"), \
            users_code("m.py:make", "make()"):  # fmt: skip
        raise KeyError()
    with pytest.raises(BiasvizError) as raised, users_code("m.py:make", "importing m.py"):
        sys.exit(3)
    assert str(raised.value).startswith("--model m.py:make: importing m.py called sys.exit(3); the exit came from your")
    assert type(raised.value.__cause__) is SystemExit


def test_memory_that_ran_out_in_the_users_code_passes_through_as_such() -> None:
    """Not the code's fault: the command says which memory ran out and what to change (tests/common/
    test_out_of_memory.py), not that the error came from the user's code."""
    for raised in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."), MemoryError()):
        with pytest.raises(type(raised)) as caught, users_code("m.py:make", "the model's forward"):
            raise raised
        assert caught.value is raised


@pytest.mark.parametrize("kind", [BiasvizError, StopForward, KeyboardInterrupt])
def test_biasvizs_own_signals_and_interrupts_pass_through_unchanged(kind: type[BaseException]) -> None:
    signal = kind("as raised")
    with pytest.raises(kind) as raised, users_code("m.py:make", "the model's forward"):
        raise signal
    assert raised.value is signal


# --- importing the code and building the model --------------------------------------------------------------------
CODE = """
import torch
import torch.nn.functional as F

from biasviz_factory_neighbour import WIDTH  # a module beside this file, imported as when run from there


class Tiny(torch.nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.emb = torch.nn.Embedding(50, WIDTH)
        self.fail = fail

    def forward(self, ids):
        if self.fail:
            raise RuntimeError("no attention today\\nsecond line")
        x = self.emb(ids).view(ids.shape[0], ids.shape[1], 2, WIDTH // 2).transpose(1, 2)
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)


def make(checkpoint=None):
    model = Tiny().train()
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return model


def failing():
    return Tiny(fail=True)


def three():
    return 3


LIMIT = 5
"""


@pytest.fixture
def code(tmp_path: Path) -> Iterator[Path]:
    """``code.py`` and the neighbour it imports, in a folder of their own (the neighbour forgotten after)."""
    folder = tmp_path / "user code"
    folder.mkdir()
    (folder / "biasviz_factory_neighbour.py").write_text("WIDTH = 8\n")
    (folder / "code.py").write_text(CODE)
    yield folder / "code.py"
    sys.modules.pop("biasviz_factory_neighbour", None)


def test_the_factory_builds_the_model_from_its_checkpoint(code: Path, tmp_path: Path) -> None:
    torch.manual_seed(3)
    weights = {"emb.weight": torch.randn(50, 8)}
    torch.save(weights, tmp_path / "ckpt.pt")
    path_before = list(sys.path)
    adapter = load_factory(f"{code}:make", str(tmp_path / "ckpt.pt"))
    assert sys.path == path_before
    assert torch.equal(adapter.model.emb.weight, weights["emb.weight"]) and not adapter.model.training
    assert adapter.source == f"{code.resolve()}:make ({(tmp_path / 'ckpt.pt').resolve()})"
    assert adapter.sha256 == hashlib.sha256((tmp_path / "ckpt.pt").read_bytes()).hexdigest()
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    adapter.forward(ids)  # runs as the user's model does
    plain = load_factory(f"{code}:make")
    assert plain.source == f"{code.resolve()}:make" and not torch.equal(plain.model.emb.weight, weights["emb.weight"])


def test_a_forward_that_fails_is_one_error_from_the_users_code(code: Path) -> None:
    adapter = load_factory(f"{code}:failing")
    with pytest.raises(BiasvizError, match=r"the model's forward failed: RuntimeError: no attention today; the error"):
        adapter.forward(torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize(("name", "message"), [
    ("three", r"three\(\) returned a int, not a torch\.nn\.Module"),
    ("absent", r"code\.py defines no callable 'absent'"),
    ("LIMIT", "defines no callable 'LIMIT'"),
])  # fmt: skip
def test_a_factory_that_builds_no_module_is_refused(code: Path, name: str, message: str) -> None:
    path_before = list(sys.path)
    with pytest.raises(BiasvizError, match=message):
        load_factory(f"{code}:{name}")
    assert sys.path == path_before


def test_code_that_fails_to_import_is_one_error_and_leaves_sys_path(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import biasviz_no_such_module_anywhere\n")
    path_before = list(sys.path)
    with pytest.raises(BiasvizError, match=r"importing broken\.py failed: ModuleNotFoundError: No module named"):
        load_factory(f"{tmp_path / 'broken.py'}:make")
    assert sys.path == path_before
    with pytest.raises(BiasvizError, match="is not a file"):
        load_factory(f"{tmp_path / 'absent.py'}:make")


DATACLASS_CODE = """
from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch


@dataclass
class Config:
    width: int = 8
    heads: int = 2


class Tiny(torch.nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.emb = torch.nn.Embedding(50, config.width)

    def forward(self, ids):
        x = self.emb(ids).view(ids.shape[0], ids.shape[1], self.config.heads, -1).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)


def make():
    config = pickle.loads(pickle.dumps(Config()))  # pickle finds the class through its module
    return Tiny(config)
"""


def test_code_whose_dataclasses_read_their_module_loads_as_a_plain_import_would(tmp_path: Path) -> None:
    """String annotations on a dataclass, and pickle, look the class's module up in ``sys.modules`` while the code runs:
    the code is registered there as an import registers it."""
    (tmp_path / "configured.py").write_text(DATACLASS_CODE)
    adapter = load_factory(f"{tmp_path / 'configured.py'}:make")
    assert adapter.model.config.width == 8 and type(adapter.model).__module__ in sys.modules
    adapter.forward(torch.zeros(1, 4, dtype=torch.long))


def test_code_that_fails_to_import_leaves_no_module_behind(tmp_path: Path) -> None:
    (tmp_path / "half.py").write_text("VALUE = 1\nraise ValueError('halfway')\n")
    before = set(sys.modules)
    with pytest.raises(BiasvizError, match=r"importing half\.py failed: ValueError: halfway"):
        load_factory(f"{tmp_path / 'half.py'}:make")
    assert set(sys.modules) == before
