"""The manifest ``make figures`` keeps (:mod:`biasviz.cli.manifest`): it dates back every target one of whose files
changed content, so ``make`` rebuilds it, and a later build keeps what an earlier one recorded. The files are written
as a step of ``make figures`` writes them (``_built``, shared with tests/project/test_make_outputs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from biasviz.cli.manifest import record, stale
from tests.project.test_make_outputs import _built


def test_the_manifest_rebuilds_a_replaced_figure_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs, data, figures = tmp_path / "runs", tmp_path / "data", tmp_path / "figures"
    log, manifest = runs / "stages" / "written.log", runs / "stages" / "built.json"
    files = {runs / "alibi" / "model.safetensors": (b"w", runs / "alibi" / "model.safetensors"),
             runs / "alibi" / "checkpoint-100" / "model.safetensors": (b"c", runs / "alibi" / "model.safetensors"),
             data / "alibi.h5": (b"d", data / "alibi.h5"),
             figures / "alibi_bias.pdf": (b"p", figures / "alibi_bias.pdf"),
             figures / "alibi_weights.png": (b"q", figures / "alibi_bias.pdf"),
             figures / "alibi_profile.pdf": (b"r", figures / "diagnostics.pdf"),
             figures / "diagnostics.pdf": (b"s", figures / "diagnostics.pdf"),
             figures / "alibi_explore.html": (b"h", figures / "alibi_explore.html")}  # fmt: skip
    for path, (content, target) in files.items():
        _built(path, content, target, monkeypatch, log)
    monkeypatch.chdir(tmp_path)
    assert record(manifest, log, runs, data, figures) == len(files)
    assert not log.exists() and stale(manifest) == []
    (figures / "alibi_weights.png").write_bytes(b"an example's figure")  # same name, other content
    (figures / "alibi_profile.pdf").unlink()
    (runs / "alibi" / "checkpoint-100" / "model.safetensors").write_bytes(b"other")
    got = stale(manifest)
    assert sorted(got) == sorted([figures / "alibi_bias.pdf", figures / "diagnostics.pdf",
                                  runs / "alibi" / "model.safetensors"])  # fmt: skip
    assert all(os.stat(p).st_mtime == 0 for p in got)
    assert os.stat(data / "alibi.h5").st_mtime > 0 and os.stat(figures / "alibi_explore.html").st_mtime > 0


def test_a_later_build_keeps_what_the_earlier_one_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build with nothing to rebuild logs nothing: the manifest still lists the earlier build's files."""
    runs, data, figures = tmp_path / "runs", tmp_path / "data", tmp_path / "figures"
    log, manifest = runs / "stages" / "written.log", runs / "stages" / "built.json"
    _built(data / "alibi.h5", b"d", data / "alibi.h5", monkeypatch, log)
    _built(figures / "t5_bias.pdf", b"t", figures / "t5_bias.pdf", monkeypatch, log)
    assert record(manifest, log, runs, data, figures) == 2
    (figures / "t5_bias.pdf").write_bytes(b"yours now")  # replaced by hand: no longer the build's
    assert record(manifest, log, runs, data, figures) == 1
    _built(figures / "t5_bias.pdf", b"t2", figures / "t5_bias.pdf", monkeypatch, log)  # rebuilt: the build's again
    assert record(manifest, log, runs, data, figures) == 2
