"""How a page's size budget becomes detail (biasviz.explorer.detail): an overview of every head, then full
resolution, then exact values, in the order the page opens on; two files share one budget, and a sweep's every
checkpoint fits it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from biasviz.explorer.build import build_page_data
from biasviz.explorer.encode import pack_exact
from tests.explorer.test_build import STEPS, unpack, write_sweep


def test_large_matrices_follow_the_budget_with_an_overview_and_the_best_detail_that_fits(
    tmp_path: Path, make_bias_file: Callable[..., Path]
) -> None:
    src = make_bias_file(tmp_path / "cable.h5", "cable", n=1, heads=3, t=600)
    data = build_page_data([src], kind="all", max_mb=0.9)
    heads = [h for s in data.payload["sets"].values() for h in s["heads"]]
    assert all(h["levels"][-1]["f"] == 4 and h["levels"][-1]["n"] == 150 for h in heads)  # the overview
    assert any(lv["f"] == 1 for h in heads for lv in h["levels"])  # some detail at full resolution
    total = sum(len(lv["data"]) for h in heads for lv in h["levels"])
    assert total <= 0.9e6
    assert "16-bit" in data.summary() or "block means" in data.summary()
    tight = build_page_data([src], kind="all", max_mb=0.05)
    assert tight.over_budget > 0 and "pass the size budget" in tight.summary()
    roomy = build_page_data([src], kind="bias", max_mb=20)
    assert roomy.precision == {"exact (float32)": 3}



def test_two_files_share_one_budget_and_keep_exact_detail(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    a = make_bias_file(tmp_path / "a.h5", "cable", n=1, heads=4, t=600, seed=1)
    b = make_bias_file(tmp_path / "b.h5", "cable", n=1, heads=4, t=600, seed=2)
    with h5py.File(a) as fa, h5py.File(b) as fb:  # what A's and B's heads take exact (A - B would add half again)
        exact = sum(pack_exact(f["layer_3/bias"][0, h]).nbytes for f in (fa, fb) for h in range(4))
    mb = 1.2 * exact / 1e6 + 0.2
    one = build_page_data([a], kind="bias", max_mb=mb)
    two = build_page_data([a, b], kind="bias", max_mb=mb)
    for data in (one, two):
        assert len(json.dumps(data.payload)) <= mb * 1e6 and data.over_budget == 0
    assert one.precision == {"exact (float32)": 4}
    assert two.precision == {"exact (float32)": 8}, two.precision  # A's and B's heads: nothing spent on A - B
    assert all(h["levels"] == [] for h in two.payload["sets"]["D|3|bias|0"]["heads"])



def test_a_sweep_holds_every_checkpoint_within_the_budget(tmp_path: Path) -> None:
    src = write_sweep(tmp_path / "sweep.h5", heads=3, n=1)
    roomy = build_page_data([src], kind="bias").payload
    assert roomy["steps"] == STEPS and roomy["opening"] == len(STEPS) - 1
    with h5py.File(src) as f:
        for c in range(len(STEPS)):
            got = unpack(roomy["sets"][f"A|1|bias|0|{c}"]["heads"][2]["levels"][0])
            assert np.array_equal(got, f["layer_1/bias"][c, 0, 2], equal_nan=True)
    tight = build_page_data([src], kind="all", max_mb=0.07)  # too small for every checkpoint exact
    payload = tight.payload
    assert len(json.dumps(payload)) <= 0.07e6 and tight.over_budget == 0
    assert {k.rsplit("|", 1)[1] for k in payload["sets"]} == {"0", "1", "2"}  # every checkpoint is there
    first = {k: [h["levels"][0]["enc"] for h in s["heads"]] for k, s in payload["sets"].items()}
    assert first["A|1|bias|0|2"] == first["A|1|weights|0|2"] == ["f32"] * 3, "the checkpoint the page opens on first"
    assert "q16" in first["A|1|weights|0|0"] + first["A|1|weights|0|1"], first  # the others in 16 bits
