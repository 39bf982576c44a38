"""Memory that runs out part-way through a command (:mod:`biasviz.common.out_of_memory`): the errors torch and numpy
really raise are recognised, and the command says it in one ``Error:`` line, leaving nothing behind.

The host's failures are real ones (an allocation no machine can give fails at once, without touching memory), and so
is a limit on the process's data, which the checks before a run count. A GPU cannot run here: its error is torch's own
exception class with the text of torch's CUDA caching allocator."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.common.out_of_memory import GPU, HOST, failure_text, out_of_memory_message, ran_out
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM
from tests.hostile import Case, check, run, snapshot

# torch 2.x's words for a failed allocation of its CUDA caching allocator
CUDA_TEXT = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
             "1.21 GiB is free. Including non-PyTorch memory, this process has 138.58 GiB memory in use.")  # fmt: skip


def _raised(make: object) -> BaseException:
    try:
        make()  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - the error itself is what is tested
        return exc
    raise AssertionError("nothing was raised")


def test_the_errors_torch_and_numpy_raise_are_recognised_with_the_size_asked() -> None:
    host = ran_out(_raised(lambda: torch.empty(2**62, dtype=torch.uint8)))  # torch's CPU allocator
    assert host is not None and host.where == HOST and host.asked == "4096.0 PiB"  # 2^62 bytes
    array = ran_out(_raised(lambda: np.empty(2**62, np.uint8)))  # numpy's MemoryError
    assert array is not None and array.where == HOST and array.asked == "4.00 EiB"
    gpu = ran_out(torch.OutOfMemoryError(CUDA_TEXT))
    assert gpu is not None and gpu.where == GPU and gpu.asked == "20.00 GiB"
    try:  # one raised while handling it, or from it, is the same allocation
        try:
            raise torch.OutOfMemoryError(CUDA_TEXT)
        except torch.OutOfMemoryError as exc:
            raise ValueError("the model's own code wrapped it") from exc
    except ValueError as wrapped:
        assert ran_out(wrapped) == gpu
    for other in (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), ValueError("out of memory"),
                  RuntimeError("Triton Error [CUDA]: out of resource: shared memory, Required: 262144")):  # fmt: skip
        assert ran_out(other) is None, other


def test_the_line_names_the_commands_own_options_and_on_a_gpu_the_way_off_it() -> None:
    gpu = ran_out(torch.OutOfMemoryError(CUDA_TEXT))
    assert gpu is not None
    full = out_of_memory_message(gpu, "extract", ["extract", "--model", "m"])
    assert full.startswith("the GPU ran out of memory part-way through 'biasviz extract' (an allocation of 20.00 GiB")
    assert "try --summary" in full and "--device cpu" in full and full.endswith("No partial output was left behind.")
    summary = out_of_memory_message(gpu, "extract", ["extract", "--summary"])
    assert "a coarser --resolution" in summary and "try --summary" not in summary
    assert "--batch-size" in out_of_memory_message(gpu, "train", ["train"])
    plot = out_of_memory_message(ran_out(MemoryError()), "plot", ["plot"])  # type: ignore[arg-type]
    assert plot.startswith("this machine ran out of memory part-way through 'biasviz plot';") and "--" not in plot
    for line in (full, summary, plot):
        assert "\n" not in line


def test_what_a_process_says_of_its_models_error() -> None:
    """torchrun's processes and a sweep: memory that ran out in its one line (a sweep then says what it kept, not that
    nothing was left), any other error by its type and text."""
    oom = torch.OutOfMemoryError(CUDA_TEXT)
    assert failure_text(oom, "extract") == out_of_memory_message(ran_out(oom), "extract")  # type: ignore[arg-type]
    kept = failure_text(oom, "extract", nothing_left=False)
    assert kept.startswith("the GPU ran out of memory part-way through 'biasviz extract'")
    assert kept.endswith("(docs/big-models.md)")  # no word of what was left behind
    assert failure_text(ValueError("a shape mismatch"), "extract") == "ValueError: a shape mismatch"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four heads that take any length: at T = 4096, a batch of four's weights are 1 GiB a layer (float32)."""
    folder = tmp_path_factory.mktemp("shared") / "ckpt"
    config = BiasGPTConfig(scheme="alibi", n_layer=2, n_head=4, n_embd=32, vocab_size=300, n_positions=64)
    BiasGPTForCausalLM(config).eval().save_pretrained(folder)
    return folder


def test_a_command_that_runs_out_of_host_memory_says_so_in_one_line_and_leaves_nothing(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """torch's allocator refusing part-way through the forward (an allocation no machine can give: its real error)."""

    def forward(self: ModelAdapter, input_ids: torch.Tensor) -> None:
        torch.empty(2**62, dtype=torch.uint8)

    monkeypatch.setattr(ModelAdapter, "forward", forward)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(out, checkpoint)
    code, _, err = run(["extract", "--model", str(checkpoint), "--seq-len", "16", "--samples", "2", "--quiet",
                        "--out", str(out / "a.h5")], capsys)  # fmt: skip
    err = "\n".join(line for line in err.splitlines() if not line.startswith("Warning: "))  # no tokenizer.json
    check(Case("host memory", "", r"^Error: this machine ran out of memory part-way through 'biasviz extract' \(an "
                                  r"allocation of 4096\.0 PiB failed\); try --summary .*left behind\.$"), code, err)
    assert snapshot(out, checkpoint) == before


def test_a_limit_on_the_process_refuses_before_any_work(checkpoint: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A limit on the command's data (1.5 GiB, as a cluster's job may have) below what the batch's matrices need (two
    layers' weights, bias and the first sample's bias, 1 GiB each at T = 4096 and a batch of four): refused before the
    model runs, the limit named, as the machine's memory is."""
    out = tmp_path / "out"
    out.mkdir()

    def data_limit() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (3 << 29, 3 << 29))

    argv = ["extract", "--model", str(checkpoint), "--seq-len", "4096", "--samples", "4", "--batch-size", "4",
            "--layer", "all", "--out", str(out / "a.h5"), "--quiet"]  # fmt: skip
    before = snapshot(out, checkpoint)
    code, _, err = run(argv, capsys, in_subprocess=True, preexec=data_limit)
    err = "\n".join(line for line in err.splitlines() if not line.startswith("Warning: "))
    said = (r"^Error: a batch of 4 x 4 heads x 4096 x 4096 needs about 6\.0 GiB of memory, more than the 1\.5 GiB "
            r"this process may use \(its limit: ulimit.*; use a smaller --batch-size, fewer layers, a shorter "
            r"--seq-len, or --summary \(keeps no T x T matrix\)$")  # fmt: skip
    check(Case("a limit", "", said), code, err)
    assert snapshot(out, checkpoint) == before


def test_a_gpu_that_runs_out_part_way_is_one_line_naming_it(checkpoint: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    def forward(self: ModelAdapter, input_ids: torch.Tensor) -> None:
        raise torch.OutOfMemoryError(CUDA_TEXT)

    monkeypatch.setattr(ModelAdapter, "forward", forward)
    out = tmp_path / "a.h5"
    code, _, err = run(["extract", "--model", str(checkpoint), "--seq-len", "16", "--samples", "2", "--quiet",
                        "--out", str(out)], capsys)  # fmt: skip
    err = "\n".join(line for line in err.splitlines() if not line.startswith("Warning: "))
    check(Case("gpu", "", r"^Error: the GPU ran out of memory part-way through 'biasviz extract' \(an allocation of "
                          r"20\.00 GiB failed\); .*--device cpu runs it in host memory"), code, err)
    assert not out.exists() and list(tmp_path.iterdir()) == []
