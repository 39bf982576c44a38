"""Numerical faults are reported, never silently stored or plotted: NaN/inf weights, float16 overflow, damaged data."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.cli import main
from biasviz.data import build_tokenizer, save_tokenizer
from tests.conftest import small_model
from tests.project.test_untrusted import write_valid

TEXT = "\n".join(f"while n{i} > {i}:\n    n{i} -= {i + 2}  # loop {i}" for i in range(300))


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), err
    return lines[0]


def _save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory)
    save_tokenizer(build_tokenizer([TEXT], 300), directory)
    return directory


@pytest.mark.parametrize(("value", "word"), [(float("nan"), "NaN"), (float("inf"), "infinite")])
def test_checkpoint_with_non_finite_weights_is_refused_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               value: float, word: str) -> None:  # fmt: skip
    model = small_model("t5", vocab_size=300)
    with torch.no_grad():
        model.blocks[1].mlp.c_fc.weight[3, 5] = value
    ck = _save(model, tmp_path / "ck")
    (tmp_path / "t.txt").write_text(TEXT)
    line = _error(["extract", "--model", str(ck), "--text", str(tmp_path / "t.txt"), "--seq-len", "8",
                   "--samples", "1", "--out", str(tmp_path / "o.h5")], capsys)  # fmt: skip
    assert re.search(rf"weight 'blocks\.1\.mlp\.c_fc\.weight' holds {word} values \(1 of \d+\)", line), line
    assert not (tmp_path / "o.h5").exists()


def test_state_dict_with_inf_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = {k.replace("blocks.", "transformer.h.", 1).replace("embed.", "transformer.wte.", 1): v.clone()
             for k, v in small_model("nope", vocab_size=300).state_dict().items() if not k.startswith("lm_head")}
    state = {("transformer." + k if k.startswith("ln_f.") else k): v for k, v in state.items()}
    state["transformer.wte.weight"][7, 0] = float("-inf")
    torch.save({"model": state, "model_args": {"n_head": 12}}, tmp_path / "m.pt")
    line = _error(["extract", "--model", str(tmp_path / "m.pt"), "--scheme", "nope", "--out", str(tmp_path / "o.h5")],
                  capsys)  # fmt: skip
    assert "'embed.weight' holds infinite values" in line


@pytest.mark.parametrize("where", [0, 6, 7, 13, 29])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_checked_slice_by_slice_to_the_last_value(monkeypatch: pytest.MonkeyPatch, where: int,
                                                              dtype: torch.dtype) -> None:  # fmt: skip
    """A large weight is checked a slice at a time (7 values here): a NaN in any slice, the last one short, is found."""
    import biasviz.adapters as adapters

    monkeypatch.setattr(adapters, "FINITE_STEP", 7)
    weight = torch.ones(5, 6, dtype=dtype)
    assert adapters._all_finite(weight)
    weight.view(-1)[where] = float("nan")
    assert not np.isfinite(weight.float().numpy()).all()  # numpy's word on it
    assert adapters._all_finite(weight) is False


def test_float16_overflow_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ALiBi with slopes of 1e4: at distance 15 the bias is -1.5e5, beyond float16's 65504."""
    model = small_model("alibi", vocab_size=300, scheme_options={"slopes": [1e4] * 12})
    ck = _save(model, tmp_path / "ck")
    (tmp_path / "t.txt").write_text(TEXT)
    args = ["extract", "--model", str(ck), "--text", str(tmp_path / "t.txt"), "--seq-len", "16", "--samples", "1"]
    line = _error([*args, "--dtype", "float16", "--out", str(tmp_path / "h.h5")], capsys)
    assert "beyond float16's range" in line and "--dtype float32" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "t.txt"]
    main([*args, "--out", str(tmp_path / "f.h5")])  # float32 holds it
    assert (tmp_path / "f.h5").exists()


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_plot_and_diagnose_refuse_non_finite_causal_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          bad: float) -> None:  # fmt: skip
    f = write_valid(tmp_path / "d.h5", heads=3, t=8)
    with h5py.File(f, "a") as h:
        h["layer_1/bias"][1, 2, 5, 3] = bad  # a causal cell (j <= i) of head 3, sample 1
    figs = tmp_path / "figs"
    line = _error(["plot", "--scheme", "alibi", "--input", str(f), "--sample", "mean", "--out-dir", str(figs)],
                  capsys)  # fmt: skip
    assert "head 3" in line and "NaN or infinite" in line and not figs.exists()
    line = _error(["plot", "--scheme", "alibi", "--input", str(f), "--sample", "1", "--out-dir", str(figs)], capsys)
    assert "head 3" in line and not figs.exists()
    main(["plot", "--scheme", "alibi", "--input", str(f), "--sample", "0", "--format", "png", "--out-dir", str(figs)])
    assert (figs / "alibi_bias.png").exists()  # sample 0 is intact and may be drawn
    line = _error(["diagnose", str(f), "--out-dir", str(tmp_path / "diag")], capsys)
    assert "NaN or infinite" in line and "d.h5" in line and not (tmp_path / "diag").exists()


def test_nan_in_masked_cells_is_normal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The masked cells (j > i) hold NaN by design; they must not trip the check."""
    f = write_valid(tmp_path / "ok.h5", heads=3, t=8)
    with h5py.File(f, "r") as h:
        assert np.isnan(h["layer_1/bias"][0, 0, 2, 5])
    main(["plot", "--scheme", "alibi", "--input", str(f), "--format", "png", "--out-dir", str(tmp_path / "figs")])
    main(["diagnose", str(f), "--no-figures", "--json", str(tmp_path / "d.json")])
    assert (tmp_path / "d.json").exists()
