"""User code is the user's: ``--model code.py:FACTORY`` that exits, raises, or builds a model whose forward does.

Every case is one ``Error:`` line that says the failure came from the user's code, a non-zero exit and
nothing written; ``--debug`` adds the traceback of their code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import Case, make_assets, run_case

MODEL = '''
import sys
import torch
import torch.nn.functional as F
from torch import nn


class Tiny(nn.Module):
    def __init__(self, mode=""):
        super().__init__()
        self.emb = nn.Embedding(300, 16)
        self.mode = mode

    def forward(self, ids):
        x = self.emb(ids)
        q = x.view(x.shape[0], x.shape[1], 2, 8).transpose(1, 2)
        if self.mode == "raise":
            raise ValueError("boom in forward")
        if self.mode == "raise lines":
            raise ValueError("first line\\nsecond line\\nthird")
        if self.mode == "exit":
            sys.exit(4)
        if self.mode == "nan":  # one head's scores are NaN: its weights must never be stored as zeros
            q = q.clone()
            q[:, 0] = float("nan")
        if self.mode == "exit after attention":
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            sys.exit(0)
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)
'''


def code(head: str = "", factory: str = "return Tiny()") -> object:
    """A ``prepare`` writing {tmp}/code.py: ``head`` runs at import, ``make()`` runs ``factory``."""

    def prepare(tmp: Path, _paths: dict[str, str]) -> None:
        (tmp / "code.py").write_text(f"{MODEL}\n{head}\n\ndef make():\n    {factory}\n")

    return prepare


EX = ("extract --model {tmp}/code.py:make --tokenizer {alibi}/tokenizer.json --text {text} --seq-len 8 --samples 1 "
      "--quiet --out {tmp}/o.h5")
YOURS = r"came from your code \(biasviz --debug shows the traceback\)"

USER_CODE = [
    Case("sys.exit at import", EX, r"importing code\.py called sys\.exit\(3\); the exit " + YOURS,
         prepare=code(head="sys.exit(3)")),
    Case("SystemExit with text at import", EX, r"importing code\.py called sys\.exit\('stop here'\)",
         prepare=code(head="raise SystemExit('stop here')")),
    Case("exception at import", EX, r"importing code\.py failed: RuntimeError: bad import; the error " + YOURS,
         prepare=code(head="raise RuntimeError('bad import')")),
    Case("syntax error", EX, r"importing code\.py failed: SyntaxError", prepare=code(head="def (:")),
    Case("sys.exit(0) in the factory", EX, r"make\(\) called sys\.exit\(0\)", prepare=code(factory="sys.exit(0)")),
    Case("exception in the factory", EX, r"make\(\) failed: KeyError: 'weights'",
         prepare=code(factory="raise KeyError('weights')")),
    Case("factory returns None", EX, r"make\(\) returned a NoneType, not a torch\.nn\.Module",
         prepare=code(factory="return None")),
    Case("forward raises", EX, r"the model's forward failed: ValueError: boom in forward; the error " + YOURS,
         prepare=code(factory="return Tiny('raise')")),
    Case("forward raises on several lines", EX, r"forward failed: ValueError: first line; the error",
         prepare=code(factory="return Tiny('raise lines')")),
    Case("forward calls sys.exit", EX, r"the model's forward called sys\.exit\(4\)",
         prepare=code(factory="return Tiny('exit')")),
    Case("forward exits 0 after attention", EX, r"the model's forward called sys\.exit\(0\)",
         prepare=code(factory="return Tiny('exit after attention')")),
    Case("NaN scores in one head", EX, r"weights of layer 0 contains? NaN", prepare=code(factory="return Tiny('nan')")),
    Case("NaN scores in one head, summarised", EX.replace("--quiet", "--quiet --summary"), r"NaN",
         prepare=code(factory="return Tiny('nan')")),
]  # fmt: skip


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_assets(tmp_path_factory.mktemp("usercode"))


@pytest.mark.parametrize("case", USER_CODE, ids=str)
def test_user_code_failures_are_one_error_naming_their_code(case: Case, paths: dict[str, str], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run_case(case, paths, tmp_path, capsys)
    assert not (tmp_path / "o.h5").exists()


def test_debug_shows_the_users_traceback(paths: dict[str, str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from tests.conftest import run_cli

    code(factory="return Tiny('raise')")(tmp_path, paths)
    argv = ["--debug", *EX.format(tmp=tmp_path, **paths).split()]
    status, _, err = run_cli(argv, capsys)
    assert status == 1 and "Traceback" in err and str(tmp_path / "code.py") in err and "boom in forward" in err
    assert err.strip().splitlines()[-1].startswith("Error: ")


def test_table_size() -> None:
    assert len(USER_CODE) >= 8
