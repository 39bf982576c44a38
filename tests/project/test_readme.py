"""README and the site tell the truth: the scheme table comes from the registry, and every Python example runs
(README's and the site's pages', in reading order)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from biasviz.cli.schemes_cmd import scheme_rows
from biasviz.schemes import SCHEMES
from tests.docs_pages import blocks
from tests.docs_pages import text as page_text

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_two_setup_commands_and_ci_calls_the_test_command() -> None:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)  # the first shell block: the two commands
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make figures", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_scheme_table_is_the_registry() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "biasviz.cli", "schemes", "--markdown"], capture_output=True, text=True, check=True
    ).stdout.strip()
    page = page_text("schemes.md")
    assert out in page
    assert [r["name"] for r in scheme_rows()] == list(SCHEMES)
    for name in SCHEMES:
        assert f"`{name}`" in page


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding data/alibi.h5 and data/fire.h5 extracted from small random models."""
    import torch

    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.run import extract
    from tests.conftest import small_model

    root = tmp_path_factory.mktemp("readme")
    gen = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 97, (3, 48), generator=gen).numpy()
    for scheme in ("alibi", "fire"):
        adapter = BiasGPTAdapter(small_model(scheme), source=f"random {scheme}")
        extract(adapter, windows, root / "data" / f"{scheme}.h5", device="cpu", progress=False)
    return root


PYTHON_BLOCKS = blocks("python")


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)), ids=[f"{p}-{k}" for k, (p, _) in enumerate(PYTHON_BLOCKS)])
def test_python_examples_run(index: int, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page, code = PYTHON_BLOCKS[index]
    if "import xarray" in code or "to_xarray" in code:
        pytest.importorskip("xarray")
    monkeypatch.chdir(workdir)
    exec(compile(code, f"{page} python block {index + 1}", "exec"), {"__name__": "__readme__"})
