"""``plot --kind`` is its table (biasviz.plotting.kinds): every row names a function that makes its figures, the CLI
offers the rows and nothing else, and a kind added as a row is offered and drawn by its own function."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from biasviz.plotting import kinds
from tests.conftest import run_cli


def kind_option():  # noqa: ANN201
    from biasviz.cli.plot_cmd import plot

    return next(p for p in plot.params if p.name == "kind")


@pytest.mark.parametrize("row", kinds.PLOT_KINDS, ids=lambda row: row.name)
def test_every_kind_names_a_runner_with_the_shared_signature(row: kinds.PlotKind) -> None:
    run = kinds.runner(row.name)
    assert callable(run)
    assert tuple(inspect.signature(run).parameters) == kinds.RUNNER_PARAMETERS
    if row.figure:  # a family's runner draws the figure its row names
        assert callable(kinds.resolve(row.figure))
    if row.needs == "summary":  # a summary kind's file says what it shows
        assert row.about


def test_every_measure_kind_has_its_caption_and_its_band() -> None:
    """A docs/position-measures.md kind drawn by ``run_measure`` reads its caption's quantity and its SE by name."""
    from biasviz.plotting.caption import PROFILE_QUANTITIES
    from biasviz.plotting.measures_plots import _SE_OF

    measures = [k.name for k in kinds.PLOT_KINDS if k.run.endswith(":run_measure")]
    assert measures == ["bands", "context", "frequency"]
    for name in measures:
        assert name in PROFILE_QUANTITIES and name in _SE_OF


def test_the_cli_offers_the_table_and_nothing_else() -> None:
    option = kind_option()
    assert tuple(option.type.choices) == kinds.NAMES == kinds.kind_names()
    assert len(set(kinds.NAMES)) == len(kinds.NAMES)
    assert option.help == kinds.kind_help()
    assert option.default in kinds.NAMES


def test_an_unknown_kind_has_no_row() -> None:
    with pytest.raises(KeyError):
        kinds.plot_kind("nope")


def test_a_new_kind_is_its_function_plus_a_row(tmp_path: Path, make_bias_file: Callable[..., Path],
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    calls: list[tuple[object, ...]] = []

    def run_toy(job, kind: str, out_dir: Path, formats: list[str], dpi: int) -> list[Path]:  # noqa: ANN001
        calls.append((job.scheme, kind, out_dir, formats, dpi))
        return [out_dir / f"{job.scheme}_{kind}.png"]

    module = types.ModuleType("biasviz_toy_kind")
    module.run_toy = run_toy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "biasviz_toy_kind", module)
    row = kinds.PlotKind("toy", "a toy figure", "any", "biasviz_toy_kind:run_toy")
    monkeypatch.setattr(kinds, "PLOT_KINDS", (*kinds.PLOT_KINDS, row))

    file = make_bias_file(tmp_path / "alibi.h5", "alibi", heads=2, t=8)
    out = tmp_path / "figs"
    code, stdout, err = run_cli(["plot", "--scheme", "alibi", "--input", str(file), "--kind", "toy", "--format",
                                 "png", "--dpi", "50", "--out-dir", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    assert calls == [("alibi", "toy", out, ["png"], 50)]
    assert stdout.strip() == f"wrote {out / 'alibi_toy.png'}"

    monkeypatch.setattr(kinds, "PLOT_KINDS", tuple(k for k in kinds.PLOT_KINDS if k.name != "toy"))
    code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(file), "--kind", "toy"], capsys)
    assert code == 2 and "'toy' is not one of" in err, err
