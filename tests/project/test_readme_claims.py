"""README statements of the form 'X is refused', 'X is an error', 'X is noted' that no other test showed.

Each test runs the claim as the README states it: a refusal is a non-zero exit, exactly one stderr line
starting ``Error:`` holding the key phrase, and nothing written; a note is in ``t.notes`` with no bias recorded.
The claims already shown elsewhere are listed in the review that added this file, not repeated here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import biasviz
from tests.conftest import run_cli, small_model


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.strip()]


def assert_one_error(code: int, err: str, *phrases: str) -> None:
    lines = error_lines(err)
    assert code != 0, err
    assert len(lines) == 1 and lines[0].startswith("Error:"), lines
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# README: "Context-dependent schemes (CABLE, FoX with its full gate) are refused with a clear error, since
# their bias needs text." (test_bias_only covers CABLE; FoX with its full gate is shown here.)
def test_bias_only_refuses_fox_with_its_full_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small_model("fox").save_pretrained(tmp_path / "fox")
    before = files_under(tmp_path)
    out = tmp_path / "x.h5"
    code, _, err = run_cli(["extract", "--model", str(tmp_path / "fox"), "--bias-only", "--seq-len", "32",
                            "--device", "cpu", "--out", str(out)], capsys)  # fmt: skip
    assert_one_error(code, err, "depends on the input")
    assert not out.exists() and files_under(tmp_path) == before


# README: "Names that match nothing ... are left out; two names for one step are an error."
def test_two_names_for_one_step_are_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.series_models import tiny_bloom

    run = tmp_path / "run"
    for k, name in enumerate(["checkpoint-0", "checkpoint-100", "step_100"]):
        tiny_bloom(k).save_pretrained(run / name)
    (tmp_path / "t.txt").write_text("some text to read " * 40)
    before = files_under(tmp_path)
    out = tmp_path / "sweep.h5"
    code, _, err = run_cli(["extract", "--model", str(run), "--checkpoints", "all", "--samples", "2", "--seq-len",
                            "8", "--text", str(tmp_path / "t.txt"), "--device", "cpu", "--quiet", "--out",
                            str(out)], capsys)  # fmt: skip
    assert_one_error(code, err, "'checkpoint-100' and 'step_100' are both step 100")
    assert not out.exists() and not (tmp_path / "sweep.h5.partial").exists()
    assert files_under(tmp_path) == before


# README: "Options that cannot apply are errors ...: ... diagnose --format/--style/--dpi with --no-figures."
# (test_hostile covers --format; --style and --dpi are shown here.)
@pytest.mark.parametrize("option", [["--style", "acl"], ["--dpi", "300"]], ids=["style", "dpi"])
def test_diagnose_figure_options_with_no_figures_are_errors(option: list[str], tmp_path: Path,
                                                            make_bias_file: Callable[..., Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    file = make_bias_file(tmp_path / "a.h5", t=16)
    before = files_under(tmp_path)
    code, _, err = run_cli(["diagnose", str(file), "--no-figures", *option, "--json", str(tmp_path / "d.json"),
                            "--out-dir", str(tmp_path / "figs")], capsys)  # fmt: skip
    assert_one_error(code, err, option[0], "--no-figures")
    assert files_under(tmp_path) == before


# README: "BIASVIZ_HDF5_TIMEOUT seconds (default 60; a value that is not a positive number of seconds up to a
# week is an error)". test_hostile_values covers nan, inf, -5, 1e400 and text; the bounds are shown here.
@pytest.mark.parametrize("value", ["0", "604801"], ids=["zero", "just-over-a-week"])
def test_an_hdf5_timeout_outside_zero_to_a_week_is_an_error(value: str, tmp_path: Path,
                                                            make_bias_file: Callable[..., Path],
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    file = make_bias_file(tmp_path / "a.h5", t=16)
    before = files_under(tmp_path)
    monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", value)
    code, out, err = run_cli(["plot", "--scheme", "alibi", "--input", str(file), "--format", "png", "--out-dir",
                              str(tmp_path / "figs")], capsys)  # fmt: skip
    assert_one_error(code, err, f"BIASVIZ_HDF5_TIMEOUT='{value}'", "is not a number of seconds")
    assert files_under(tmp_path) == before
    monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", "604800")  # a week exactly is allowed
    code, out, err = run_cli(["info", str(file)], capsys)
    assert code == 0, err


# README: "Not additive, so noted in t.notes and never stored as a bias: softcapping (tested in test_calls and
# test_eager), products of the scores with tensors, a convolution over heads (x-transformers' talking
# heads), and a second q·kᵀ added cell for cell." (Moved terms such as DeBERTa's: tests/tracing/test_eager_reshapes.py.)
H, T, D = 4, 6, 8


class Eager(torch.nn.Module):
    """Attention written out in eager PyTorch, with one step between the scores and the softmax."""

    def __init__(self, step: str) -> None:
        super().__init__()
        self.step = step
        self.proj = torch.nn.Linear(D, 3 * H * D)
        self.talking_heads = torch.nn.Conv2d(H, H, 1, bias=False)  # as x-transformers mixes the heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = (z.view(n, T, H, D).transpose(1, 2) for z in self.proj(x).split(H * D, dim=-1))
        s = q @ k.transpose(-2, -1) / D**0.5
        if self.step == "product":
            s = s * torch.sigmoid(q.sum(-1, keepdim=True))  # scores times a tensor
        elif self.step == "talking-heads":
            s = self.talking_heads(s)
        elif self.step == "two-products":
            s = s + (q * 0.5) @ k.transpose(-2, -1)  # a second content term added
        return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("step", ["product", "talking-heads", "two-products"])
def test_non_additive_steps_are_noted_and_never_a_bias(step: str) -> None:
    torch.manual_seed(0)
    model = Eager(step).eval()
    x = torch.randn(2, T, D)
    with torch.no_grad(), biasviz.trace(model) as t:
        out = model(x)
    with torch.no_grad():
        assert torch.equal(out, model(x))  # the model ran unchanged
    assert [c.kind for c in t.calls] == ["eager"], t.calls
    assert t.bias == {} and not t.calls[0].adds_bias
    assert 0 in t.notes and "not additive" in t.notes[0], t.notes
