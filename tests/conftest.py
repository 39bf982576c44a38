"""Shared fixtures: small models that build in milliseconds."""

from __future__ import annotations

import pytest
import torch
from transformers.utils import logging as hf_logging

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

RELATIVE_SCHEMES = ["alibi", "kerple-log", "kerple-power", "fire", "t5", "cable", "fox"]
ALL_SCHEMES = [*RELATIVE_SCHEMES, "learned", "nope"]


def small_config(scheme: str, **overrides: object) -> BiasGPTConfig:
    """2 layers, 12 heads, width 48, vocabulary 97: GPT-2's head count at a size tests can afford."""
    args = {"n_layer": 2, "n_head": 12, "n_embd": 48, "n_positions": 256, "vocab_size": 97, **overrides}
    return BiasGPTConfig(scheme=scheme, **args)


def small_model(scheme: str, seed: int = 0, **overrides: object) -> BiasGPTForCausalLM:
    torch.manual_seed(seed)
    return BiasGPTForCausalLM(small_config(scheme, **overrides)).eval()


@pytest.fixture(autouse=True)
def _quiet_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    hf_logging.disable_progress_bar()


# End-to-end modules (real subprocesses, whole CLI runs, figures written to disk) and single tests that
# take over a second here: `make test-fast` leaves them out, `make test` runs everything.
SLOW_MODULES = {"test_interrupts", "test_cli_plot", "test_cli_imports", "test_untrusted", "test_readme",
                "test_errors", "test_fuzz_info", "test_numerical", "test_train", "test_bias_only", "test_hostile",
                "test_hostile_io"}  # fmt: skip
SLOW_TESTS = {"test_pdf_has_raster_heatmaps_vector_text_and_metadata", "test_png_and_svg_carry_metadata",
              "test_presets_have_gpt2_small_shape_and_twelve_heads"}  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests; CUDA tests skip cleanly on machines without a GPU (CI has none)."""
    for item in items:
        module = item.path.stem
        if module in SLOW_MODULES or getattr(item, "originalname", "") in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``biasviz ARGS`` in-process: (exit code, stdout, stderr) of this call only."""
    from biasviz.cli import main

    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    got = capsys.readouterr()
    return code, got.out, got.err
