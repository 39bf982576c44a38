"""`biasviz explore` without a browser: the page's contents and the size budget (the command's errors:
tests/cli/test_explore_cmd.py)."""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.common.errors import BiasvizError
from biasviz.explorer.build import build_page_data
from biasviz.explorer.encode import dequantise
from biasviz.store import open_bias_file
from tests.conftest import SYNTHETIC_ATTRS, run_cli, softmax_weights, synthetic_bias


def unpack(spec: dict) -> np.ndarray:
    """What explorer.js does to a packed matrix, in numpy: the reference the page is held to."""
    width = 4 if spec["enc"] == "f32" else 2
    raw = np.frombuffer(zlib.decompress(base64.b64decode(spec["data"])), np.uint8)
    n = spec["n"]
    ints = raw.reshape(width, -1).T.copy().view(np.uint32 if width == 4 else np.uint16).ravel()
    if spec.get("toeplitz"):
        d = np.subtract.outer(np.arange(n), np.arange(n))
        ints = ints[np.where(d >= 0, d, n - 1 - d)]
    else:
        ints = ints.reshape(n, n)
        for i in range(1, n):
            ints[i, 1:] = ints[i, 1:] + ints[i - 1, :-1]
    if spec["enc"] == "f32":
        return ints.view(np.float32)
    return dequantise(ints, spec["lo"], spec["step"])


STEPS = [0, 50, 200]
SWEEP_T = 32


def write_sweep(path: Path, heads: int = 3, n: int = 2) -> Path:
    """A small sweep file: every checkpoint its own CABLE-like bias (and its weights), T = 32."""
    from biasviz.store import BiasFileWriter

    meta = {**SYNTHETIC_ATTRS, "scheme": "cable", "context_dependent": True}
    with BiasFileWriter(path, attrs=meta, n_samples=n, n_heads=heads, seq_len=SWEEP_T, layers=[1], has_bias=True,
                        checkpoints=STEPS, force=True) as writer:  # fmt: skip
        writer.begin_batch(np.zeros((n, SWEEP_T), np.int32))
        for c in range(len(STEPS)):
            bias = synthetic_bias("cable", n, heads, SWEEP_T, seed=10 + c)
            weights = softmax_weights(bias)
            for s in range(n):
                for h in range(heads):
                    writer.write_matrix("bias", 1, s, h, bias[s, h], checkpoint=c)
                    writer.write_matrix("weights", 1, s, h, weights[s, h], checkpoint=c)
    return path


def page_payload(html: str) -> dict:
    text = re.search(r'<script type="application/json" id="biasviz-data">(.*?)</script>', html, re.S).group(1)
    return json.loads(text.replace("<\\/", "</"))


def test_page_is_self_contained_with_one_canvas_per_head(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    src = make_bias_file(tmp_path / "alibi.h5", "alibi", heads=5)
    out = tmp_path / "page.html"
    code, stdout, err = run_cli(["explore", str(src), "--out", str(out)], capsys)
    assert code == 0, err
    assert f"wrote {out}" in stdout
    html = out.read_text()
    assert len(re.findall(r"<canvas data-head=\"\d+\"", html)) == 5
    assert not re.search(r"https?://", html), "the page must load nothing from the network"
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\(", html)
    payload = page_payload(html)
    assert payload["n_heads"] == 5 and payload["seq_len"] == 64 and payload["kinds"] == ["bias", "weights"]
    with h5py.File(src) as f:
        stored = f["layer_3/bias"][1, 2]
    exact = unpack(payload["sets"]["A|3|bias|1"]["heads"][2]["levels"][0])
    assert np.array_equal(exact, stored, equal_nan=True)


def test_two_files_give_a_difference(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    a = make_bias_file(tmp_path / "a.h5", "cable", n=2, seed=1)
    b = make_bias_file(tmp_path / "b.h5", "alibi", n=3)
    payload = build_page_data([a, b], kind="bias").payload
    assert [s["label"] for s in payload["sources"]] == ["A", "B", "D"]
    assert payload["sources"][2]["samples"] == ["0", "1", "mean"]
    with h5py.File(a) as fa, h5py.File(b) as fb:
        stored_a, stored_b = fa["layer_3/bias"][1, 4], fb["layer_3/bias"][1, 4]
    # A - B travels as no matrix: the page subtracts B's cells from A's (both exact here)
    assert payload["sets"]["D|3|bias|1"]["heads"][4]["levels"] == []
    got_a, got_b = (unpack(payload["sets"][f"{s}|3|bias|1"]["heads"][4]["levels"][0]) for s in "AB")
    assert np.array_equal(got_a - got_b, stored_a - stored_b, equal_nan=True)
    diff = stored_a - stored_b
    lo, hi = float(np.nanmin(diff)), float(np.nanmax(diff))  # every cell's extremes, centred at 0 ...
    if min(-lo, hi) < (hi - lo) / 20:  # ... symmetric where one side is under a twentieth of the range
        lo, hi = -max(-lo, hi), max(-lo, hi)
    assert lo < 0 < hi and payload["sets"]["D|3|bias|1"]["scale"]["head"][4] == [lo, hi, "RdBu_r", "centred"]


def test_files_that_differ_in_shape_are_not_compared(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    a = make_bias_file(tmp_path / "a.h5", heads=4, t=16)
    b = make_bias_file(tmp_path / "b.h5", heads=3, t=16)
    with pytest.raises(biasviz.common.errors.BiasvizError, match="cannot be compared cell by cell"):
        build_page_data([a, b])


def test_python_api_renders_in_notebooks_and_saves(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    page = biasviz.explore(make_bias_file(tmp_path / "x.h5", heads=2, t=16), kind="bias")
    assert page._repr_html_().startswith("<iframe srcdoc=")
    assert page.save(tmp_path / "sub" / "x.html").stat().st_size == page.nbytes
    with pytest.raises(biasviz.common.errors.BiasvizError, match="already exists"):
        page.save(tmp_path / "sub" / "x.html")


def test_colour_scales_span_every_cell_not_block_means(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    src = make_bias_file(tmp_path / "alibi.h5", "alibi", n=1, heads=2, t=1100)  # reduced for drawing
    scales = build_page_data([src], kind="bias", max_mb=2).payload["sets"]["A|3|bias|0"]["scale"]
    with h5py.File(src) as f:
        stored = f["layer_3/bias"][0]
    for h in range(2):
        assert scales["head"][h][:2] == [float(np.nanmin(stored[h])), float(np.nanmax(stored[h]))]
    assert scales["shared"][:2] == [float(np.nanmin(stored)), float(np.nanmax(stored))]


def test_a_weights_scale_ending_below_the_largest_weight_says_so(tmp_path: Path,
                                                                  make_bias_file: Callable[..., Path]) -> None:
    """A linear weights scale ends at the 99.5th percentile of the head's cells (as plot's, which draws an arrow
    above it): the page marks such a scale "over", so that its bar's top reads "≥ value"; a bias scale, which ends at
    the largest value, is not marked."""
    src = make_bias_file(tmp_path / "c.h5", "cable", n=1, heads=2, t=64)
    sets = build_page_data([src], kind="weights", max_mb=2).payload["sets"]
    scales = sets["A|3|weights|0"]["scale"]
    with h5py.File(src) as f:
        stored = f["layer_3/weights"][0]
    for h in range(2):
        finite = stored[h][np.isfinite(stored[h])]
        vmax = scales["head"][h][1]
        assert float(np.percentile(finite, 99.5)) <= vmax + 1e-7 and vmax <= finite.max() + 1e-7
        assert (scales["head"][h][4:] == ["over"]) == (vmax < finite.max())
    assert any(s[4:] == ["over"] for s in scales["head"])  # these heads' largest weights lie above their scales
    assert (scales["shared"][4:] == ["over"]) == (scales["shared"][1] < np.nanmax(stored))
    bias = build_page_data([src], kind="bias", max_mb=2).payload["sets"]["A|3|bias|0"]["scale"]
    assert all(len(s) < 5 for s in [*bias["head"], bias["shared"]])


def test_a_sweep_is_compared_only_with_a_sweep_of_the_same_steps(
    tmp_path: Path, make_bias_file: Callable[..., Path]
) -> None:
    sweep = write_sweep(tmp_path / "sweep.h5", heads=3, n=1)
    plain = make_bias_file(tmp_path / "plain.h5", "cable", n=1, heads=3, t=SWEEP_T, layers=(1,))
    with pytest.raises(biasviz.common.errors.BiasvizError, match="cannot be compared step by step"):
        build_page_data([sweep, plain])


def test_a_summary_switches_to_scores_and_positional_logits(tmp_path: Path) -> None:
    """docs/positional.md in the page: a summary's scores and P, each head's values exactly the file's maps."""
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.run import extract
    from biasviz.extraction.summary import extract_summary
    from tests.conftest import small_model

    ids = np.random.default_rng(3).integers(0, 97, size=(3, 32))
    adapter = BiasGPTAdapter(small_model("rope"), source="test")
    extract_summary(adapter, ids, tmp_path / "s.h5", layers=[1], resolution=32, device="cpu", progress=False)
    page = biasviz.explore(tmp_path / "s.h5")
    payload = page_payload(page.html)
    assert payload["kinds"] == ["weights", "scores", "positional"]
    with h5py.File(tmp_path / "s.h5") as f:
        for kind in ("scores", "positional"):
            for h in range(f.attrs["n_heads"]):
                shown = unpack(payload["sets"][f"A|1|{kind}|mean"]["heads"][h]["levels"][0])
                assert np.array_equal(shown, f[f"layer_1/{kind}_mean"][h], equal_nan=True)
    # docs/position-measures.md under each head of the weights: band mass per distance (each bin's over its width) and
    # context mass, with their SEs, as the file holds them; bins as /distance_bins' first and last distance
    bf = open_bias_file(tmp_path / "s.h5")
    bins = np.asarray(payload["sets"]["A|1|weights|mean"]["heads"][0]["measures"]["bins"])
    np.testing.assert_array_equal(bins, bf.summary.distance_bins())
    width = bins[:, 1] - bins[:, 0] + 1.0
    for h in range(bf.n_heads):
        m = payload["sets"]["A|1|weights|mean"]["heads"][h]["measures"]
        for key, name, scale in (("band", "band_mass", width), ("context", "context_mass", 1.0)):
            for part, want in (("mean", bf.summary_array(name, 1)[0, h]), ("se", bf.summary_array(f"{name}_se", 1)[h])):
                got = np.frombuffer(base64.b64decode(m[key][part]), "<f4")
                np.testing.assert_allclose(got, want / scale, rtol=1e-6, equal_nan=True, err_msg=f"{name} {part}")
    assert all("measures" not in head for head in payload["sets"]["A|1|scores|mean"]["heads"])
    only = page_payload(biasviz.explore(tmp_path / "s.h5", kind="positional").html)
    assert only["kinds"] == ["positional"]
    extract(adapter, ids, tmp_path / "full.h5", layers=[1], device="cpu", progress=False,
            capture=["weights", "scores"])  # fmt: skip
    full = page_payload(biasviz.explore(tmp_path / "full.h5").html)
    assert full["kinds"] == ["weights", "scores"]
    with h5py.File(tmp_path / "full.h5") as f:
        shown = unpack(full["sets"]["A|1|scores|0"]["heads"][0]["levels"][0])
        assert np.array_equal(shown, f["layer_1/scores"][0, 0], equal_nan=True)
    with pytest.raises(BiasvizError, match="hold no positional"):
        biasviz.explore(tmp_path / "full.h5", kind="positional")


def test_a_traced_file_s_layers_are_named_as_its_calls_and_their_modules(tmp_path: Path,
                                                                        make_bias_file: Callable[..., Path]) -> None:
    """A traced model's layers are its attention calls (``call_modules``, data from the file): the page names each
    call and the module that made it; two files whose modules differ name both; a file of layers says "layer"."""
    owners = ["model.layers.0.self_attn", "model.layers.0.self_attn", "model.layers.1.<b>attn</b>"]
    traced = make_bias_file(tmp_path / "traced.h5", "alibi", n=2, t=16, layers=(1, 2),
                            attrs={"n_layers": 3, "call_modules": json.dumps(owners)})  # fmt: skip
    other = make_bias_file(tmp_path / "other.h5", "alibi", n=2, t=16, layers=(1, 2),
                           attrs={"n_layers": 3, "call_modules": json.dumps(["a", "b", "c"])})  # fmt: skip
    plain = make_bias_file(tmp_path / "plain.h5", "alibi", n=2, t=16, layers=(1, 2))
    names = build_page_data([traced]).payload["layer_names"]
    assert names == {"1": "attention call 1 (model.layers.0.self_attn)",
                     "2": "attention call 2 (model.layers.1.<b>attn</b>)"}  # fmt: skip
    assert build_page_data([plain]).payload["layer_names"] == {"1": "layer 1", "2": "layer 2"}
    both = build_page_data([traced, other]).payload["layer_names"]
    assert both["1"] == "attention call 1 (A: model.layers.0.self_attn, B: b)"
    mixed = build_page_data([traced, plain]).payload["layer_names"]
    assert mixed["2"] == "attention call 2 (A: model.layers.1.<b>attn</b>, B: a layer)"


def test_each_layer_s_own_rule_reaches_the_page(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    """A full file whose calls differ (an encoder-decoder's causal decoder self-attention beside calls that see every
    key) gives the page each layer's rule: its read-out says "masked (key after query)" by the layer's."""
    path = make_bias_file(tmp_path / "mixed.h5", "alibi", n=2, t=16, layers=(1, 2))
    with h5py.File(path, "a") as f:
        f.attrs["causal"] = False
        f["layer_1/bias"][...] = np.nan_to_num(f["layer_1/bias"][...], nan=0.5)  # layer 1 sees every key
        f["layer_2"].attrs["causal"] = True
    payload = build_page_data([path]).payload
    assert payload["causal"] is False and payload["layer_causal"] == {"1": False, "2": True}
