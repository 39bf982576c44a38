"""Where the summaries take a GPU's shapes (:mod:`biasviz.common.shapes`): any device but the CPU, or the CPU while
:func:`gpu_shapes` forces it (and only while); a GPU's steps at least 2**26 cells; tensors to the host as numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.common.shapes import GPU_STEP_CELLS, gpu_shaped, gpu_shapes, host_arrays, step_cells


def test_a_gpu_step_is_256_mib_of_float32() -> None:
    assert GPU_STEP_CELLS == 2**26 and GPU_STEP_CELLS * 4 == 256 * 2**20


@pytest.mark.parametrize(("device", "gpu"), [
    ("cpu", False), (torch.device("cpu"), False), ("cuda", True), (torch.device("cuda", 1), True), ("meta", True),
])  # fmt: skip
def test_every_device_but_the_cpu_takes_a_gpus_shape(device: str | torch.device, gpu: bool) -> None:
    assert gpu_shaped(device) is gpu


def test_gpu_shapes_forces_the_cpu_only_inside_the_block() -> None:
    with gpu_shapes():
        assert gpu_shaped("cpu")
        with gpu_shapes():
            assert gpu_shaped("cpu")
        assert gpu_shaped("cpu")  # an inner block gives back what was, not False
    assert not gpu_shaped("cpu")
    with pytest.raises(RuntimeError), gpu_shapes():
        raise RuntimeError("a test that fails inside")
    assert not gpu_shaped("cpu")


@pytest.mark.parametrize("cpu_cells", [1, 1 << 22, 2**26, 2**27 + 3])
def test_step_cells_is_the_cpus_size_on_a_cpu_and_at_least_2_to_the_26_on_a_gpu(cpu_cells: int) -> None:
    assert step_cells("cpu", cpu_cells) == cpu_cells
    assert step_cells("cuda", cpu_cells) == max(cpu_cells, 2**26)
    with gpu_shapes():
        assert step_cells("cpu", cpu_cells) == max(cpu_cells, 2**26)


def test_host_arrays_are_the_tensors_values_and_none_stays_none() -> None:
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_()  # detached on the way
    b = torch.tensor([True, False])
    got = host_arrays(a, None, b)
    assert got[1] is None and len(got) == 3
    assert isinstance(got[0], np.ndarray) and got[0].dtype == np.float32
    np.testing.assert_array_equal(got[0], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert got[2].dtype == np.bool_ and got[2].tolist() == [True, False]
    assert host_arrays() == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_arrays_from_a_gpu_are_the_same_values() -> None:
    t = torch.arange(12, dtype=torch.float16, device="cuda").reshape(3, 4)
    (got, none, cpu) = host_arrays(t * 2, None, torch.ones(2))
    assert none is None and got.dtype == np.float16 and cpu.tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(got, 2 * np.arange(12, dtype=np.float16).reshape(3, 4))
