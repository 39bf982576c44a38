"""A GPU on which Triton cannot build or launch the fused kernels (:func:`biasviz.summaries.kernels.refused`): its
layers are summarised by the torch path, the same numbers, and the kernels are not tried again in the run; any other
error is raised as it is.

No GPU refuses here: the kernels' entry raises the error Triton raises where a GPU has less shared memory than a tile
needs (a consumer card's 100 KiB), while Triton's interpreter stands for the GPU that would run them."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.conftest import small_model

T = 32


def _summary(out: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> tuple[dict[str, np.ndarray], list[str]]:
    monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
    ids = np.random.default_rng(3).integers(0, 97, size=(3, T))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(small_model("alibi", n_head=4), ids, out, layers=[0, 1], summary=True, resolution=8,
                        device="cpu", progress=False)  # fmt: skip
    with h5py.File(out) as f:
        held = {f"{g}/{name}": f[g][name][()] for g in ("layer_0", "layer_1") for name in f[g]}
        return held, [str(f[g].attrs["statistics"]) for g in ("layer_0", "layer_1")]


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - the kernels' package, as a GPU would run it here
    pytest.importorskip("triton")
    from biasviz.summaries import kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # what unavailable() reads: the interpreter stands for the GPU
    monkeypatch.setattr(kernels, "_REFUSED", {})  # nothing refused before this test, nothing after it
    return kernels


def test_a_gpu_that_refuses_the_kernels_gets_the_torch_paths_numbers_and_no_second_try(
        kernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001  # fmt: skip
    from triton.runtime.errors import OutOfResources

    tried: list[int] = []

    def refuse(*args: object, **kwargs: object) -> None:
        tried.append(1)
        raise OutOfResources(262144, 101376, "shared memory")

    monkeypatch.setattr(kernels, "layer_accumulators", refuse)
    torch_path, said = _summary(tmp_path / "torch.h5", monkeypatch, "torch")
    assert said == ["torch", "torch"]
    refused, said = _summary(tmp_path / "refused.h5", monkeypatch, "fused")
    assert said == ["torch", "torch"] and tried == [1]  # the second layer went to torch at once
    assert kernels.unavailable(torch.device("cpu")) == ("Triton could not build or launch them for this GPU "
                                                        "(OutOfResources: out of resource: shared memory, Required: "
                                                        "262144, Hardware limit: 101376)")  # fmt: skip
    assert set(refused) == set(torch_path)
    for name, want in torch_path.items():
        got = refused[name]
        if want.dtype.names:
            for field in want.dtype.names:
                np.testing.assert_array_equal(got[field], want[field], err_msg=name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("error", [ValueError("a bug of the kernels' caller"),
                                   torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB."),
                                   RuntimeError("Triton Error [CUDA]: out of memory")])  # fmt: skip
def test_any_other_error_is_raised_as_it_is(kernels, error: Exception, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001  # fmt: skip
    """A bug must fail, and memory that ran out is said as such (tests/common/test_out_of_memory.py), not hidden."""

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(kernels, "layer_accumulators", fail)
    with pytest.raises(type(error)) as raised:
        _summary(tmp_path / "x.h5", monkeypatch, "fused")
    assert raised.value is error and kernels._REFUSED == {}
    from triton.runtime.errors import InterpreterError

    assert kernels.refused(torch.device("cpu"), InterpreterError("a kernel's own bug, under the interpreter")) is None
