"""``biasviz.explore(t)``: a trace explored as it is, with no file of the user's, checked against h5py reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.common.errors import BiasvizError
from tests.conftest import small_model


@pytest.fixture(scope="module")
def traced() -> tuple[torch.nn.Module, torch.Tensor, object]:
    model = small_model("alibi")
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), biasviz.trace(model) as t:
        model(ids)
    return model, ids, t


def page_data(html: str) -> dict:
    return json.loads(re.search(r'id="biasviz-data">(.*?)</script>', html, re.S).group(1))


def test_a_trace_page_holds_what_extract_writes(traced: tuple, tmp_path: Path) -> None:
    model, ids, t = traced
    page = biasviz.explore(t, input_ids=ids, kind="bias")
    biasviz.extract(model, ids, tmp_path / "m.h5", layers="all", progress=False)
    from_file = biasviz.explore(tmp_path / "m.h5", kind="bias")
    assert page.title == "biasviz explorer: trace of BiasGPTForCausalLM" and "<iframe srcdoc=" in page._repr_html_()
    with h5py.File(tmp_path / "m.h5") as f:
        assert list(f.attrs["layers"]) == [0, 1] and f["input_ids"][()].tolist() == ids.tolist()
    assert page.summary == from_file.summary  # every head exact in both
    assert "ExplorerPage" in repr(page) and len(repr(page)) < 300  # a notebook's text form is not the page


def test_a_trace_page_without_ids_and_one_call(traced: tuple) -> None:
    _, _, t = traced
    page = biasviz.explore(t, layer=-2, kind="weights")
    data = page_data(page.html)
    assert (data["layers"], data["kinds"], data["n_heads"], data["seq_len"]) == ([0], ["weights"], 12, 16)
    assert page_data(biasviz.explore(t, kind="bias").html)["layers"] == [0, 1]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"layer": 5}, "the trace recorded calls 0, 1; layer 5 is none of them"),
    ({"input_ids": torch.zeros(3, 16, dtype=torch.long)}, "input_ids are (3, 16); the traced calls saw (2, 16)"),
])  # fmt: skip
def test_a_trace_page_refuses_what_does_not_fit(traced: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(BiasvizError, match=re.escape(message)):
        biasviz.explore(traced[2], **kwargs)


def test_explore_refuses_what_is_neither_a_path_nor_a_trace() -> None:
    with pytest.raises(BiasvizError, match="a file path or a biasviz.trace, not ndarray"):
        biasviz.explore(np.zeros(3))
    with pytest.raises(BiasvizError, match="input_ids are for a trace"):
        biasviz.explore("data/none.h5", input_ids=[1, 2])
