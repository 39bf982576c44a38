"""Files from elsewhere are data: a crafted pickle never runs, HDF5 attributes are only ever read and printed.

Each malicious input carries a payload that would leave a marker file if it ever executed; the tests
assert the marker never appears, whatever biasviz answers.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.store import BiasFileWriter
from tests.conftest import run_cli

BIASVIZ = Path(sys.executable).with_name("biasviz")
ATTRS = {"scheme": "alibi", "context_dependent": False, "source_model": "synthetic", "model_sha256": "",
         "architecture": "synthetic", "n_layers": 2, "device": "cpu", "seed": 0, "text_source": "synthetic",
         "biasviz_version": "0", "torch_version": "0"}  # fmt: skip


def write_valid(path: Path, n: int = 2, heads: int = 3, t: int = 8, layers: tuple[int, ...] = (1,)) -> Path:
    """A small, valid format-1 file (ALiBi-like bias, uniform causal weights), written without a model."""
    d = np.subtract.outer(np.arange(t), np.arange(t)).astype(np.float32)
    bias = -np.arange(1, heads + 1, dtype=np.float32)[:, None, None] * d
    w = np.tril(np.ones((t, t), np.float32)) / np.arange(1, t + 1, dtype=np.float32)[:, None]
    weights = np.broadcast_to(w, (n, heads, t, t))
    with BiasFileWriter(path, attrs=ATTRS, n_samples=n, n_heads=heads, seq_len=t, layers=list(layers),
                        has_bias=True, force=True) as writer:  # fmt: skip
        writer.write_batch(np.zeros((n, t), np.int32), {k: weights for k in layers}, {k: bias[None] for k in layers})
    return path


class _Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_cli(args, capsys)


# -- pickles -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["torch-top-level", "torch-beside-tensors", "plain-pickle", "protocol-0"])
def test_crafted_pickle_is_refused_and_never_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  how: str) -> None:  # fmt: skip
    marker = tmp_path / "ran"
    payload = _Payload(marker)
    f = tmp_path / "model.pt"
    if how == "torch-top-level":
        torch.save(payload, f)
    elif how == "torch-beside-tensors":
        torch.save({"transformer.wte.weight": torch.zeros(4, 4), "extra": payload}, f)
    elif how == "plain-pickle":
        f.write_bytes(pickle.dumps({"model": payload}, protocol=4))
    else:
        f.write_bytes(pickle.dumps(payload, protocol=0))
    code, _, err = _run(["extract", "--model", str(f), "--scheme", "alibi", "--out", str(tmp_path / "o.h5")], capsys)
    assert code == 1 and err.startswith("Error: ") and len(err.strip().splitlines()) == 1, err
    assert "refusing to load" in err or "not a readable PyTorch checkpoint" in err or "not a PyTorch" in err
    assert not marker.exists()
    assert not (tmp_path / "o.h5").exists()


def test_crafted_ckpt_pt_inside_a_checkpoint_directory(tmp_path: Path) -> None:
    """nanoGPT's out_dir/ckpt.pt is found by directory; run in a subprocess as a user would."""
    marker = tmp_path / "ran"
    (tmp_path / "out").mkdir()
    torch.save({"model": {"transformer.wte.weight": torch.zeros(4, 4)}, "optimizer": _Payload(marker)},
               tmp_path / "out" / "ckpt.pt")  # fmt: skip
    proc = subprocess.run([str(BIASVIZ), "extract", "--model", str(tmp_path / "out"), "--scheme", "alibi",
                           "--out", str(tmp_path / "o.h5")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: refusing to load") and "ckpt.pt" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


# -- HDF5 attributes ---------------------------------------------------------------------------------------


def _hostile_file(path: Path, marker: Path) -> Path:
    write_valid(path)
    pickled = pickle.dumps(_Payload(marker))
    with h5py.File(path, "a") as f:
        f.attrs["pickled_bytes"] = np.void(pickled)  # opaque bytes that happen to be a pickle
        f.attrs["pickled_text"] = pickle.dumps(_Payload(marker), protocol=0).decode("ascii")
        f.attrs["huge"] = "x" * 2_000_000
        f.attrs["compound"] = np.array([(1, 2.5, b"abc")], dtype=[("a", "i4"), ("b", "f8"), ("c", "S3")])
        f.attrs.create("vlen", np.array(["one", "two"], dtype=object), dtype=h5py.string_dtype())
        f.attrs["config_json"] = json.dumps({"__class__": "os.system", "cmd": f"touch {marker}",
                                             "eval": f"__import__('os').system('touch {marker}')"})  # fmt: skip
        f.attrs["tokenizer"] = "!!python/object/apply:os.system ['touch " + str(marker) + "']"  # YAML-style bait
    return path


def test_info_prints_hostile_attributes_as_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    f = _hostile_file(tmp_path / "h.h5", marker)
    code, out, err = _run(["info", str(f)], capsys)
    assert code == 0, err
    lines = out.splitlines()
    huge = next(line for line in lines if line.lstrip().startswith("huge"))
    assert len(huge) < 400 and "2000000 characters" in huge  # shown cut short, with its true size
    assert any(line.lstrip().startswith("compound") and "2.5" in line and "abc" in line for line in lines)
    assert any(line.lstrip().startswith("vlen") and "one" in line and "two" in line for line in lines)
    assert any(line.lstrip().startswith("pickled_bytes") for line in lines)
    assert "!!python/object/apply" in out  # printed as the text it is
    code, out, err = _run(["info", "--json", str(f)], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config_json"]["__class__"] == "os.system"  # parsed as JSON data, nothing else
    assert len(doc["huge"]) == 2_000_000 and doc["compound"] == [[1, 2.5, "abc"]]
    assert not marker.exists()


def test_config_json_that_is_not_json_stays_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    f = write_valid(tmp_path / "c.h5")
    with h5py.File(f, "a") as h:
        h.attrs["config_json"] = f"__import__('os').system('touch {marker}')"
    code, out, _ = _run(["info", "--json", str(f)], capsys)
    assert code == 0 and json.loads(out)["config_json"].startswith("__import__")
    with h5py.File(f, "a") as h:
        h.attrs["config_json"] = np.array([1, 2, 3])  # not even text
    code, out, _ = _run(["info", "--json", str(f)], capsys)
    assert code == 0 and json.loads(out)["config_json"] == [1, 2, 3]
    assert not marker.exists()


def test_required_attribute_of_a_hostile_type_is_a_clear_error(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    marker = tmp_path / "ran"
    f = write_valid(tmp_path / "s.h5")
    with h5py.File(f, "a") as h:
        h.attrs["scheme"] = np.void(pickle.dumps(_Payload(marker)))
    code, _, err = _run(["plot", "--scheme", "alibi", "--input", str(f), "--out-dir", str(tmp_path / "fig")], capsys)
    assert code == 1 and err.startswith("Error: ") and "attribute 'scheme' should be text" in err
    assert not marker.exists() and not (tmp_path / "fig").exists()


HOSTILE_SCHEMES = ["../../escaped", "/tmp/absolute", "..", ".hidden", "a/b/c", "tab\tname", "x" * 300,
                   "back\\slash", "<script>", "  ", "ünï/cödé", "../" * 20 + "deep"]  # fmt: skip
#: The names diagnose is run on end to end, one for each way a name taken as a path goes wrong: up and out of the
#: folder, to an absolute path, past a file system's name length, and a dot-only name (hidden, and nothing left once
#: the dots go). Each of the rest is one of these dangers again (a '/' or '\\' inside, more '../', odd characters):
#: their stems are checked below, and these runs check that diagnose names its figures by that stem.
RUN_SCHEMES = ["../../escaped", "/tmp/absolute", "x" * 300, ".."]


@pytest.mark.parametrize("scheme", HOSTILE_SCHEMES)
def test_every_hostile_scheme_name_becomes_one_safe_file_name(tmp_path: Path, scheme: str) -> None:
    """What diagnose names a figure after (``file_stem`` of the scheme attribute) is one name inside --out-dir:
    no folder separator, not hidden, not empty, not over-long, whatever the file says."""
    from biasviz.common.outputs import file_stem

    stem = file_stem(scheme)
    assert stem and "/" not in stem and "\\" not in stem and not stem.startswith("."), stem
    assert len(stem) <= 80, len(stem)
    out_dir = tmp_path / "out" / "figs"
    for suffix in ("_bias_profile.png", "_training.pdf"):
        path = out_dir / (stem + suffix)
        assert path.parent == out_dir and path.resolve().is_relative_to(out_dir.resolve()), path


@pytest.mark.parametrize("scheme", RUN_SCHEMES)
def test_a_scheme_name_from_a_file_never_leaves_the_output_folder(make_bias_file, tmp_path, capsys, scheme) -> None:
    """diagnose names its figures after the file's scheme attribute: only a safe stem inside --out-dir."""
    from biasviz.common.outputs import file_stem

    src = make_bias_file(tmp_path / "in.h5", "alibi", n=2, t=16, attrs={"scheme": scheme})
    out_dir = tmp_path / "out" / "figs"
    before = {p for p in tmp_path.parent.rglob("*") if p.is_file()}
    code, _, err = run_cli(["diagnose", str(src), "--json", str(out_dir / "d.json"), "--out-dir", str(out_dir),
                            "--format", "png"], capsys)  # fmt: skip
    assert code in (0, 1), err
    after = {p for p in tmp_path.parent.rglob("*") if p.is_file()}
    for path in after - before:  # everything new lies inside out_dir (or the input's folder), nothing hidden
        assert path.resolve().is_relative_to(out_dir.resolve()), path
        assert not path.name.startswith(".") and len(path.name) < 120, path
    naive = (out_dir / f"{scheme}_bias_profile.png").resolve()  # where the name, taken as a path, would have led
    assert naive.is_relative_to(out_dir.resolve()) or not naive.exists(), naive
    if code == 0:  # the figure is named by file_stem, whose every hostile name the test above checks
        assert (out_dir / f"{file_stem(scheme)}_bias_profile.png") in after - before, sorted(after - before)
