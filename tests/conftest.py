"""Shared fixtures: small models that build in milliseconds."""

from __future__ import annotations

import os

# Triton decides when it is imported whether its kernels run through its interpreter (on the CPU): set before anything
# imports it (torch may). Where an NVIDIA driver is, the fused kernels compile for the GPU instead.
if not os.path.exists("/proc/driver/nvidia"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tokenized training corpora are kept between runs (biasviz.data.token_cache): the suite's in a folder of its own,
# never the user's ~/.cache
import tempfile

os.environ.setdefault("BIASVIZ_CACHE", os.path.join(tempfile.gettempdir(), f"biasviz-tests-{os.getuid()}"))

# Each xdist worker takes its share of the cores for torch's threads, and so do the processes its tests start: two
# workers of as many threads as there are cores wait on each other's threads (tests/model, summaries and extraction,
# six files: 78 s with two threads each on two cores, 32 s with one). A value of the user's own stands.
WORKER_THREADS = None
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    WORKER_THREADS = max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers.utils import logging as hf_logging

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

if WORKER_THREADS is not None:  # torch read it when imported, unless something imported torch before
    torch.set_num_threads(WORKER_THREADS)

if os.environ.get("TRITON_INTERPRET") == "1":  # a kernel's helpers called without patching Triton's language anew
    from tests.triton_interpreter import patch_helpers_once

    patch_helpers_once()

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
SLOW_MODULES = {"test_cli_interrupts", "test_plot_cmd", "test_cli_imports", "test_untrusted", "test_readme",
                "test_cli_errors", "test_reader_fuzz", "test_numerical", "test_loop", "test_bias_only", "test_hostile",
                "test_hostile_io", "test_distributed", "test_page_browser", "test_screenshot", "test_cli_summary",
                "test_model_long", "test_sweep_torchrun", "test_hostile_page", "test_hostile_values",
                "test_hostile_outputs", "test_hostile_usercode", "test_hostile_concurrent", "test_hostile_names",
                "test_hostile_sweeps", "test_hostile_bytes", "test_diagnostics_plots_review", "test_page_views",
                "test_eager", "test_calls_forms", "test_torch_layers", "test_sweep",
                "test_page_review", "test_dynamics_layout", "test_long_context", "test_examples", "test_paper_figures",
                "test_docs", "test_hub", "test_resume", "test_measures_browser", "test_load"}  # fmt: skip
SLOW_TESTS = {"test_pdf_has_raster_heatmaps_vector_text_and_metadata", "test_png_and_svg_carry_metadata",
              "test_presets_have_gpt2_small_shape_and_twelve_heads", "test_a_compiled_model_is_traced_eagerly",
              "test_cli_extracts_from_code_and_factory_with_a_checkpoint",
              "test_plot_draws_a_captured_file_under_its_recorded_name",
              "test_two_traced_models_in_one_folder_keep_their_own_figures",
              "test_the_librarys_figures_are_the_commands_pngs",
              "test_info_says_what_a_summary_and_a_shared_file_hold",
              "test_diagnose_reads_the_stored_values"}  # fmt: skip


# The files that take longest (seconds summed over their tests in one `make test` on a 2-core machine with Debian's
# chromium, 2026-12-02; torch.compile's flex kernels as a fresh machine compiles them, with no cache; only their order
# matters), heaviest first. `make test` hands out whole files to its two workers in the order collected here
# (--no-loadscope-reorder, and pytest_configure below): the heavy files first, so that neither worker is left with one
# of them while the other has finished (xdist's own order, by number of tests, put the heavy files with few tests last)
HEAVY_FILES = {"extraction/test_distributed.py": 129, "summaries/test_kernels_accumulators.py": 95,
               "model/test_fused_attention.py": 70, "project/test_gpu_run.py": 55, "cli/test_cli_interrupts.py": 50,
               "project/test_examples.py": 45, "extraction/test_sweep_torchrun.py": 34,
               "project/test_hostile_values.py": 33, "project/test_hostile_io.py": 32,
               "tracing/test_calls_forms.py": 30, "project/test_hostile.py": 29, "cli/test_plot_cmd.py": 27,
               "cli/test_cli_imports.py": 25, "model/test_model_long.py": 25,
               "summaries/kernels/test_triton_kernels.py": 25, "plotting/test_style_width.py": 24,
               "explorer/test_hostile_page.py": 23, "summaries/test_fused_layer.py": 23,
               "project/test_untrusted.py": 21, "adapters/test_hostile_side_files.py": 20,
               "cli/test_cli_summary.py": 18, "summaries/test_kernels.py": 18,
               "summaries/test_fused_layer_kept.py": 16, "cli/test_cli_errors.py": 15,
               "plotting/test_position_kinds.py": 14, "explorer/test_page_browser.py": 13,
               "explorer/test_page_views.py": 13, "data/test_corpus_order.py": 13, "cli/test_cli_startup.py": 12,
               "store/test_reader_fuzz.py": 12, "plotting/test_positional_compare.py": 12,
               "cli/test_hostile_signals.py": 11, "adapters/test_device_map_errors.py": 11,
               "training/test_provenance_note.py": 11, "plotting/test_measures_plots.py": 11,
               "common/test_hostile_concurrent.py": 10}  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """xdist hands out the files in the order collected (HEAVY_FILES first), even where --no-loadscope-reorder
    was not given (a plain `pytest -n 2 --dist loadfile`)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _file_weight(item: pytest.Item) -> float:
    """Seconds a file is expected to take (HEAVY_FILES), else 0: the light files follow in collection order."""
    try:
        key = item.path.relative_to(Path(__file__).resolve().parent).as_posix()
    except ValueError:  # src/biasviz's doctests
        return 0.0
    return HEAVY_FILES.get(key, 0.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy files first (the order xdist hands out files in); mark the slow tests; CUDA tests skip cleanly on
    machines without a GPU (CI has none)."""
    items.sort(key=lambda item: -_file_weight(item))  # stable: each file's tests and the light files keep their order
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


SYNTHETIC_ATTRS = {"source_model": "synthetic", "model_sha256": "0" * 64, "architecture": "gpt2", "n_layers": 4,
                   "seed": 0, "text_source": "synthetic", "device": "cpu", "biasviz_version": "0.1.0",
                   "torch_version": "none"}  # fmt: skip


def synthetic_bias(scheme: str, n: int, heads: int, t: int, seed: int = 0) -> np.ndarray:
    """(sample, head, query, key) float32: ALiBi (the same for every sample) or a CABLE-like cumulative
    decay that changes with the sample; masked cells NaN."""
    pos = np.arange(t)
    dist = pos[:, None] - pos[None, :]
    if scheme == "alibi":
        slopes = 2.0 ** (-8 * np.arange(1, heads + 1) / heads)
        b = np.repeat((-slopes[:, None, None] * dist)[None], n, axis=0)
    else:
        rng = np.random.default_rng(seed)
        s = -np.cumsum(np.log1p(np.exp(rng.normal(size=(n, heads, t)))), axis=-1)
        b = s[..., :, None] - s[..., None, :]
    return np.where(dist >= 0, b, np.nan).astype(np.float32)


def softmax_weights(bias: np.ndarray) -> np.ndarray:
    """Post-softmax weights of scores that are the bias alone (0 where masked)."""
    z = np.where(np.isnan(bias), -np.inf, bias)
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def make_bias_file() -> Callable[..., Path]:
    """Write a small format-1 file: ``make_bias_file(path, scheme, n=2, heads=12, t=64, layers=(3,), ...)``."""

    def make(path: Path, scheme: str = "alibi", *, n: int = 2, heads: int = 12, t: int = 64,
             layers: tuple[int, ...] = (3,), input_ids: np.ndarray | None = None, seed: int = 0,
             attrs: dict[str, object] | None = None) -> Path:  # fmt: skip
        from biasviz.store import BiasFileWriter

        ids = np.zeros((n, t), np.int32) if input_ids is None else input_ids
        meta = {**SYNTHETIC_ATTRS, "scheme": scheme, "context_dependent": scheme == "cable", **(attrs or {})}
        with BiasFileWriter(path, attrs=meta, n_samples=n, n_heads=heads, seq_len=t, layers=list(layers),
                            has_bias=True, force=True) as writer:  # fmt: skip
            # every layer its own bias (the same for ALiBi, whose bias is fixed)
            biases = {layer: synthetic_bias(scheme, n, heads, t, seed + k) for k, layer in enumerate(layers)}
            writer.write_batch(ids, weights={layer: softmax_weights(b) for layer, b in biases.items()}, bias=biases)
        return path

    return make


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder biasviz makes its temporary folders in (tempfile's), here a fresh one the test can watch."""
    import tempfile

    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def exit_code(args: list[str]) -> int:
    """Run ``biasviz ARGS`` in-process: its exit code."""
    from biasviz.cli import main

    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``biasviz ARGS`` in-process: (exit code, stdout, stderr) of this call only."""
    capsys.readouterr()
    code = exit_code(args)
    got = capsys.readouterr()
    return code, got.out, got.err


def saved_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every figure a command saves from now on (while ``monkeypatch`` holds), by file stem (still written)."""
    import biasviz.plotting.save as save_module

    caught: dict[str, Any] = {}
    original = save_module.save_figure

    def catch(fig: Any, stem: Any, *args: Any, **kwargs: Any) -> Any:
        caught[Path(stem).name] = fig
        return original(fig, stem, *args, **kwargs)

    monkeypatch.setattr(save_module, "save_figure", catch)
    return caught


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every figure a command saves, by file stem (the figures are still written)."""
    return saved_figures(monkeypatch)
