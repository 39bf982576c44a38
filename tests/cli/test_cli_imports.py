"""The commands that read files or list things start without torch and transformers (seconds saved per call)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.run import extract
from tests.conftest import small_model

HEAVY = ("torch", "transformers")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("light")
    ids = np.random.default_rng(0).integers(0, 97, size=(2, 16))
    for scheme in ("alibi", "cable"):
        extract(BiasGPTAdapter(small_model(scheme), source="t"), ids, root / f"{scheme}.h5", device="cpu")
    return root


def imported_after(args: list[str], cwd) -> list[str]:  # noqa: ANN001
    """Run ``biasviz ARGS`` in a fresh interpreter; which heavy modules it imported."""
    code = (
        "import sys, json\nfrom biasviz.cli import main\ntry:\n    main(json.loads(sys.argv[1]))\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, cwd=cwd,
                          check=True)  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [["--help"], ["schemes"], ["schemes", "--markdown"], ["info", "alibi.h5"], ["plot", "--help"],
     ["plot", "--scheme", "alibi", "--input", "alibi.h5", "--out-dir", "figs", "--format", "png"],
     ["diagnose", "alibi.h5", "cable.h5", "--json", "d.json", "--out-dir", "figs", "--format", "png"],
     ["explore", "cable.h5", "alibi.h5", "--out", "e.html"]],
    ids=["help", "schemes", "schemes-md", "info", "plot-help", "plot", "diagnose", "explore"],
)  # fmt: skip
def test_reading_commands_leave_torch_and_transformers_out(files, args: list[str]) -> None:
    assert imported_after(args, files) == []


def test_the_check_can_fail(files) -> None:
    """The same probe does see torch when a command needs it (``train --help`` does not; importing does)."""
    code = "import biasviz.model"
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert out.strip() == "True"


def test_importing_biasviz_leaves_torch_out_until_the_api_is_used() -> None:
    code = ("import sys, biasviz\nbefore = 'torch' in sys.modules\nbiasviz.trace\n"
            "print(before, 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
