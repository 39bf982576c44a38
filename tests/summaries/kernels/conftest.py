"""The fixture of the kernels' unit tests: each Triton function or kernel run alone on CPU tensors."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def interpreter() -> None:
    """Under Triton's interpreter only (tests/conftest.py chooses it where there is no NVIDIA driver); on a GPU,
    tests/summaries/test_kernels*.py run the whole kernels on the device."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
