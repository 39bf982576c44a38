"""What a file says of itself (:mod:`biasviz.store.header`): read from files written with h5py (tests/summary_files.py),
so the header is held to the attributes as written, not to biasviz's writer."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.store import open_bias_file
from biasviz.store.header import checkpoint_index, read_header
from biasviz.store.validation import AttrChecks
from tests.summary_files import alibi, weights_of, write_full

N, H, T = 2, 4, 10


class _Checks(AttrChecks):
    def __init__(self, path: Path) -> None:
        self.path, self._h5 = path, h5py.File(path, "r")


@pytest.fixture
def full(tmp_path: Path) -> Path:
    bias = alibi(N, H, T)
    return write_full(tmp_path / "f.h5", "alibi", bias[:1], weights_of(bias), shared=True, layer=1)


def test_the_header_is_what_the_attributes_and_input_ids_say(full: Path) -> None:
    with h5py.File(full, "a") as f:
        f.attrs["context_dependent_known"] = False
    checks = _Checks(full)
    with checks._h5:
        h = read_header(checks)
        written = dict(checks._h5.attrs)
    assert (h.scheme, h.n_heads, h.seq_len, h.layers, h.n_samples) == ("alibi", H, T, (1,), N)
    assert h.n_layers == written["n_layers"] and h.context_dependent is False and h.context_known is False
    assert (h.causal, h.is_summary, h.bias_only, h.bias_shared, h.steps, h.lead) == (True, False, False, True, None, ())
    with open_bias_file(full) as f:  # the reader answers from it
        assert f.header == h and f.context_dependence_recorded is None


def test_a_sweeps_steps_give_the_lead_axis_and_the_checkpoint_is_checked(full: Path) -> None:
    with h5py.File(full, "a") as f:
        f.create_dataset("checkpoint", data=np.array([100, 200, 300]))
    checks = _Checks(full)
    with checks._h5:
        h = read_header(checks)
    assert h.steps == (100, 200, 300) and h.lead == (3,)
    assert [checkpoint_index(h, c, full) for c in (-1, 0, -3, 2)] == [2, 0, 0, 2]
    with pytest.raises(BiasvizError, match=r"checkpoint 3 out of range; .* 3 checkpoints \(steps 100, 200, 300\)"):
        checkpoint_index(h, 3, full)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda f: f.attrs.__setitem__("layers", np.array([0, 0])), r"attribute 'layers' \(\[0, 0\]\) is not a set"),
    (lambda f: f.attrs.__setitem__("layers", np.array([1.5])), "should be a list of layer indices"),
    (lambda f: f.attrs.__setitem__("n_heads", 0), "attribute 'n_heads' is 0, expected at least 1"),
    (lambda f: f.__delitem__("input_ids"), "no \\(sample, query\\) dataset 'input_ids' with 10 queries"),
    (lambda f: f.attrs.__setitem__("context_dependent_known", "maybe"), "'context_dependent_known' should be true"),
    (lambda f: f.attrs.__setitem__("bias_shared", True) or f.attrs.__setitem__("context_dependent", True),
     "'bias_shared' says one bias serves every sample, but the scheme is context-dependent"),
    (lambda f: f.create_dataset("checkpoint", data=np.array([0.5])), "'checkpoint' should be a list of training steps"),
])  # fmt: skip
def test_a_header_at_fault_is_one_error_naming_it(full: Path, edit: object, said: str) -> None:
    with h5py.File(full, "a") as f:
        edit(f)  # type: ignore[operator]
    with pytest.raises(BiasvizError, match=said):
        open_bias_file(full)
