"""``biasviz.plot`` calls the plotting library, never the ``biasviz plot`` command: no click command is made or
run, the CLI package is not even imported, and the figures are the command's pixels. The old module path
``biasviz.cli.notebook`` still imports, and a figure pickled while ``StyledFigure`` lived there still loads."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest

import biasviz
from biasviz.common.arguments import ArgumentTypeError
from biasviz.common.errors import UsageError

DPI = 60
pytestmark = pytest.mark.slow  # figures rendered and CLI runs


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> Path:
    return make_bias_file(tmp_path_factory.mktemp("nb") / "cable.h5", "cable", n=3, heads=4, t=16)


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def test_plot_imports_no_part_of_the_cli(small: Path) -> None:
    """In a fresh interpreter: the figures come back and no module of ``biasviz.cli`` was ever imported."""
    code = ("import json, sys, biasviz\n"
            "figs = biasviz.plot(sys.argv[1], 'all', dpi=60)\n"
            "view = biasviz.open(sys.argv[1]); repr(view); view.plot('std', dpi=60); view.close()\n"
            "cli = sorted(m for m in sys.modules if m.startswith('biasviz.cli'))\n"
            "print(json.dumps([len(figs), cli]))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(small)], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [2, []]


def test_plot_makes_and_runs_no_click_command(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import click

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a click command was made or run")

    for name in ("make_context", "invoke", "main", "parse_args"):
        monkeypatch.setattr(click.Command, name, refused)
    figs = biasviz.plot(small, "profile", dpi=DPI)
    assert isinstance(figs, list) and len(figs) == 2
    with pytest.raises(UsageError, match="--log applies to attention weights"):
        biasviz.plot(small, log=True)


def test_the_old_module_path_is_the_new_one() -> None:
    import biasviz.cli.notebook as old
    import biasviz.notebook as new

    assert (old.open, old.plot, old.View, old.INLINE_DPI) == (new.open, new.plot, new.View, new.INLINE_DPI)
    assert old.StyledFigure is new.StyledFigure and new.StyledFigure.__module__ == "biasviz.notebook"
    assert (biasviz.open, biasviz.plot) == (new.open, new.plot)
    with pytest.raises(AttributeError):
        old.Nothing  # noqa: B018


@pytest.mark.parametrize("module", ["biasviz.notebook", "biasviz.cli.notebook"])
def test_a_pickled_figure_loads_whichever_module_it_names(small: Path, module: str, tmp_path: Path) -> None:
    """A figure pickled now names ``biasviz.notebook``; one pickled before the move names ``biasviz.cli.notebook``
    (made here by naming that module while pickling). Each loads in a fresh interpreter as the one class, and
    draws the same pixels."""
    import biasviz.notebook as nb

    fig = biasviz.plot(small, "weights", log=True, dpi=DPI)
    cls = nb.StyledFigure
    try:
        cls.__module__ = module
        data = pickle.dumps(fig)
    finally:
        cls.__module__ = "biasviz.notebook"
    assert module.encode() in data
    (tmp_path / "fig.pickle").write_bytes(data)
    (tmp_path / "want.png").write_bytes(png(fig))
    code = ("import io, pickle, sys\nfrom pathlib import Path\n"
            "fig = pickle.loads(Path(sys.argv[1]).read_bytes())\n"
            "import biasviz.notebook as nb\nassert type(fig) is nb.StyledFigure, type(fig)\n"
            "buf = io.BytesIO(); fig.savefig(buf, format='png', dpi=60)\n"
            "Path(sys.argv[2]).write_bytes(buf.getvalue())\n"
            "print(fig._biasviz_style)")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fig.pickle"), str(tmp_path / "got.png")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert proc.stdout.strip() == "neurips"
    assert np.array_equal(mpimg.imread(tmp_path / "got.png"), mpimg.imread(tmp_path / "want.png"))


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"dpi": 10}, UsageError, "Invalid value for '--dpi': 10 is not in the range 50<=x<=1200."),
    ({"dpi": "abc"}, UsageError, "Invalid value for '--dpi': 'abc' is not a valid integer range."),
    ({"max_cells": 3}, UsageError, "Invalid value for '--max-cells': 3 is not in the range 16<=x<=10000."),
    ({"reduce": "min"}, UsageError, "Invalid value for '--reduce': 'min' is not one of 'mean', 'max'."),
    ({"normalize": "row"}, UsageError, "Invalid value for '--normalize': 'row' is not one of 'none', 'diagonal'."),
    ({"style": "nature"}, UsageError, "Invalid value for '--style': 'nature' is not one of 'neurips', 'iclr', 'acl', "
                                      "'acl-column', 'icml', 'icml-column'."),
    ({"cmap": True}, UsageError, "Option '--cmap' requires an argument."),
    ({"log": "yes"}, UsageError, "Got unexpected extra argument (yes)"),
    ({"width": "huge"}, Exception, "--width takes column, page or a width in inches, not 'huge'"),
    ({"sample": -1}, UsageError, "--sample must be 0 or more, not -1"),
    ({"sample": 1.5}, ArgumentTypeError, "sample must be an integer, not 1.5 (float); an index from 0, or 'mean'"),
    ({"log_distance": True}, UsageError, "--log-distance applies to a distance axis: use it with --kind profile or "
                                         "dynamics"),
])  # fmt: skip
def test_a_value_the_command_refuses_is_refused_in_its_words(small: Path, options: dict[str, Any],
                                                             error: type[Exception], message: str) -> None:  # fmt: skip
    with pytest.raises(error) as info:
        biasviz.plot(small, **options)
    assert str(info.value) == message


def test_a_folder_or_an_unknown_kind_is_refused_in_the_commands_words(small: Path) -> None:
    with pytest.raises(UsageError) as info:
        biasviz.plot(small.parent, scheme="cable")
    assert str(info.value) == f"Invalid value for '--input': File {str(small.parent)!r} is a directory."
    with pytest.raises(UsageError, match=r"^Invalid value for '--kind': 'heatmap' is not one of 'bias', 'weights'"):
        biasviz.plot(small, "heatmap")
