"""Checkpoint series: folders of any common naming, identical checkpoints, sweeps of summaries.

Tiny random GPT-NeoX (Pythia's architecture, traced) and BLOOM (hooked) models are saved as several checkpoints;
the recorded hashes are checked against hashlib over the weight files. The names of a series and log:N are tested in
tests/training/test_series.py, revisions in a local hub cache in test_hub.py, resuming a sweep in test_resume.py.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.extraction.sweep import extract_sweep, resolve_series
from tests.conftest import run_cli
from tests.series_models import VOCAB, tiny_bloom, tiny_neox

TEXT = "def f(x):\n    return x * 2  # doubled\n" * 200


def everything(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every dataset (with its bytes) and every root attribute of a file."""
    data: dict[str, np.ndarray] = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: data.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
    return data, attrs


def assert_same_file(a: Path, b: Path, may_differ: set[str]) -> None:
    da, aa = everything(a)
    db, ab = everything(b)
    assert da.keys() == db.keys()
    for name in da:
        assert da[name].dtype == db[name].dtype and da[name].tobytes() == db[name].tobytes(), name
    assert aa.keys() == ab.keys()
    assert {k for k in aa if aa[k] != ab[k]} <= may_differ


# --- folders of checkpoints, one per naming pattern ---------------------------------------------------------------
@pytest.mark.parametrize(("names", "tokens"), [
    (["checkpoint-0", "checkpoint-50", "checkpoint-100"], None),
    (["global_step0", "global_step50", "global_step100"], None),
    (["iter_0000000", "iter_0000050", "iter_0000100"], None),
    (["step_0", "step_50", "step_100"], None),
    (["step0", "step50", "step100"], None),
    (["stage1-step0-tokens0B", "stage1-step50-tokens210B", "stage1-step100-tokens420B"], [0, 210e9, 420e9]),
])  # fmt: skip
def test_a_folder_of_checkpoints_of_each_naming(tmp_path: Path, names: list[str], tokens: list[float] | None) -> None:
    root = tmp_path / "run"
    for k, name in enumerate(names):
        tiny_bloom(k).save_pretrained(root / name)
    (root / "notes").mkdir()  # not a checkpoint: ignored
    windows = np.random.default_rng(0).integers(0, VOCAB, size=(2, 12))
    out = tmp_path / "s.h5"
    extract_sweep(root, "first,last", windows, out, device="cpu", progress=False)
    with h5py.File(out) as f:
        assert list(f["checkpoint"][()]) == [0, 100]
        assert [n.decode() if isinstance(n, bytes) else n for n in f.attrs["checkpoint_names"]] == [names[0], names[2]]
        want_tokens = [-1, -1] if tokens is None else [int(tokens[0]), int(tokens[2])]
        assert list(f.attrs["checkpoint_tokens"]) == want_tokens
        hashes = json.loads(f.attrs["checkpoint_sha256"])
        for step, name in ((0, names[0]), (100, names[2])):
            assert hashes[str(step)] == hashlib.sha256((root / name / "model.safetensors").read_bytes()).hexdigest()
    assert not (tmp_path / "s.h5.partial").exists()


def test_step_pattern_reads_other_names_and_is_checked(tmp_path: Path) -> None:
    root = tmp_path / "run"
    for k, name in enumerate(["ckpt-e1-s300", "ckpt-e2-s600"]):
        tiny_bloom(k).save_pretrained(root / name)
    with pytest.raises(BiasvizError, match="holds no checkpoints whose names give a step"):
        resolve_series(root, "all")
    series = resolve_series(root, "all", r"ckpt-e\d+-s(?P<step>\d+)")
    assert [(c.step, c.name) for c in series.chosen] == [(300, "ckpt-e1-s300"), (600, "ckpt-e2-s600")]
    with pytest.raises(UsageError, match="no named group 'step'"):
        resolve_series(root, "all", r"ckpt-e\d+-s(\d+)")
    with pytest.raises(UsageError, match="not a regular expression"):
        resolve_series(root, "all", r"ckpt-(?P<step>\d+")


def test_checkpoints_with_byte_identical_weights_are_named_in_a_warning_and_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Published series have revisions equal to one another (a step branch equal to main): said, not hidden."""
    import shutil

    root = tmp_path / "run"
    tiny_bloom(0).save_pretrained(root / "checkpoint-0")
    tiny_bloom(1).save_pretrained(root / "checkpoint-50")
    shutil.copytree(root / "checkpoint-50", root / "checkpoint-100")  # the same weights under another step
    shutil.copytree(root / "checkpoint-0", root / "checkpoint-150")
    (tmp_path / "text.txt").write_text(TEXT)
    rc, _, err = run_cli(["extract", "--model", str(root), "--checkpoints", "all", "--samples", "2", "--seq-len", "8",
                          "--text", str(tmp_path / "text.txt"), "--device", "cpu", "--quiet", "--out",
                          str(tmp_path / "s.h5")], capsys)  # fmt: skip
    assert rc == 0, err
    sha = {n: hashlib.sha256((root / n / "model.safetensors").read_bytes()).hexdigest() for n in os.listdir(root)}
    want = [[a, b] for a in sorted(sha, key=lambda n: int(n.split("-")[1])) for b in sorted(sha, key=lambda n:
            int(n.split("-")[1])) if int(a.split("-")[1]) < int(b.split("-")[1]) and sha[a] == sha[b]]  # fmt: skip
    assert want == [["checkpoint-0", "checkpoint-150"], ["checkpoint-50", "checkpoint-100"]]
    with h5py.File(tmp_path / "s.h5") as f:
        assert json.loads(f.attrs["checkpoints_identical"]) == want
    warning = [line for line in err.splitlines() if "byte-identical" in line]
    assert len(warning) == 1 and "checkpoint-0 = checkpoint-150" in warning[0] and \
        "checkpoint-50 = checkpoint-100" in warning[0]  # fmt: skip
    rc, out, _ = run_cli(["info", str(tmp_path / "s.h5")], capsys)
    assert "checkpoint-0 = checkpoint-150; checkpoint-50 = checkpoint-100 (byte-identical weights)" in out


def test_a_summary_sweep_of_rope_checkpoints_keeps_positional_logits_equal_to_single_runs(tmp_path: Path) -> None:
    """docs/positional.md over training: each checkpoint's slice of a sweep is that checkpoint summarised alone."""
    from biasviz.adapters.transformers_traced import load_transformers_sdpa
    from biasviz.extraction.summary import extract_summary

    root = tmp_path / "run"
    for k, name in enumerate(["step0", "step50", "step100"]):
        tiny_neox(k).save_pretrained(root / name)
    windows = np.random.default_rng(4).integers(0, VOCAB, size=(3, 16))
    extract_sweep(root, "all", windows, tmp_path / "sweep.h5", summary=True, resolution=8, layers="all",
                  device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "sweep.h5") as sweep:
        for index, name in enumerate(["step0", "step50", "step100"]):
            single = tmp_path / f"{name}.h5"
            extract_summary(load_transformers_sdpa(root / name), windows, single, layers="all", resolution=8,
                            device="cpu", progress=False)  # fmt: skip
            with h5py.File(single) as one:
                for layer in (0, 1):
                    for key in ("positional_mean", "positional_profile", "scores_mean", "weights_key_profile",
                                "sink_share"):  # fmt: skip
                        np.testing.assert_array_equal(sweep[f"layer_{layer}/{key}"][index],
                                                      one[f"layer_{layer}/{key}"][()], err_msg=f"{name} {key}")


def test_memory_that_runs_out_in_a_later_checkpoint_is_one_line_that_says_what_was_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The first checkpoint finishes; the second's forward runs out of the GPU's memory: one error naming what ran out
    and what to change, then what the sweep kept (its finished checkpoint), not that nothing was left behind."""
    import torch

    from biasviz.adapters.base import ModelAdapter

    root = tmp_path / "run"
    for k, name in enumerate(["step0", "step50"]):
        tiny_bloom(k).save_pretrained(root / name)
    original, first = ModelAdapter.forward, []

    def forward(self: ModelAdapter, input_ids: torch.Tensor) -> None:
        first.append(first[0] if first else self)
        if self is not first[0]:  # the second checkpoint's model
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        original(self, input_ids)

    monkeypatch.setattr(ModelAdapter, "forward", forward)
    windows = np.random.default_rng(0).integers(0, VOCAB, size=(2, 12))
    with pytest.raises(BiasvizError) as failed:
        extract_sweep(root, "all", windows, tmp_path / "s.h5", device="cpu", progress=False)
    said = str(failed.value)
    assert said.startswith("process 0 failed: the GPU ran out of memory part-way through 'biasviz extract' (an "
                           "allocation of 2.00 GiB failed); try --summary"), said
    assert "the 1 of 2 checkpoints finished are kept in" in said and "No partial output" not in said
    assert "\n" not in said and not (tmp_path / "s.h5").exists()
