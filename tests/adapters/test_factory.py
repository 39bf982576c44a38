"""The user's own model code (:mod:`biasviz.adapters.factory`) through the CLI: ``--model code.py:FACTORY`` with a
checkpoint, the model it builds traced against nanoGPT's explicit path (tests/nano_gpt.py), and what fails in the
user's code as one error line."""

from __future__ import annotations

import re

import h5py
import pytest
import torch

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
