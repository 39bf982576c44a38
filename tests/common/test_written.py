"""The log of files a build wrote (:mod:`biasviz.common.written`): nothing without ``BIASVIZ_WRITTEN_LOG``; with
it, one JSON line per file with its absolute path, its SHA-256 (hashlib's, computed here) and the make target;
a folder logs each file under it and no link; reading keeps the last line for a path and skips broken lines."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from biasviz.common.written import LOG_ENV, TARGET_ENV, note_written, read_log


def lines_of(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_without_a_log_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOG_ENV, raising=False)
    (tmp_path / "a.pdf").write_bytes(b"pdf")
    note_written(tmp_path / "a.pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pdf"]


def test_a_file_is_logged_with_its_path_hash_and_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "runs" / "stages" / "written.log"  # its folder is made
    monkeypatch.setenv(LOG_ENV, str(log))
    monkeypatch.setenv(TARGET_ENV, "figures/alibi_bias.pdf")
    monkeypatch.chdir(tmp_path)
    Path("a.pdf").write_bytes(b"abc")
    note_written("a.pdf")
    note_written("a.pdf")  # appended, not replaced
    want = {"path": str(tmp_path / "a.pdf"), "sha256": hashlib.sha256(b"abc").hexdigest(),
            "target": "figures/alibi_bias.pdf"}  # fmt: skip
    assert lines_of(log) == [want, want]


def test_a_folder_logs_each_file_under_it_and_no_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "written.log"
    monkeypatch.setenv(LOG_ENV, str(log))
    monkeypatch.delenv(TARGET_ENV, raising=False)
    run = tmp_path / "run"
    (run / "checkpoint-100").mkdir(parents=True)
    (run / "model.safetensors").write_bytes(b"w")
    (run / "checkpoint-100" / "model.safetensors").write_bytes(b"c")
    os.symlink(run / "model.safetensors", run / "link.safetensors")
    note_written(run)
    assert lines_of(log) == [
        {"path": str(run / "checkpoint-100" / "model.safetensors"), "sha256": hashlib.sha256(b"c").hexdigest(),
         "target": ""},
        {"path": str(run / "model.safetensors"), "sha256": hashlib.sha256(b"w").hexdigest(), "target": ""},
    ]  # fmt: skip


def test_reading_keeps_the_last_line_of_a_path_and_skips_broken_lines(tmp_path: Path) -> None:
    log = tmp_path / "written.log"
    log.write_text("\n".join([
        json.dumps({"path": "/a", "sha256": "1", "target": "t"}),
        json.dumps({"path": "/b", "sha256": "2"}),  # no target: read as empty
        '{"path": "/c", "sha2',  # cut short by a killed step
        json.dumps(["/d", "4"]),  # not an entry
        json.dumps({"path": "/e", "sha256": 5}),  # a hash that is not text
        json.dumps({"path": "/a", "sha256": "3", "target": "u"}),  # rebuilt: the later line wins
    ]) + "\n")  # fmt: skip
    assert sorted(read_log(log), key=lambda e: e["path"]) == [
        {"path": "/a", "sha256": "3", "target": "u"}, {"path": "/b", "sha256": "2", "target": ""}]


def test_a_missing_log_has_no_entries(tmp_path: Path) -> None:
    assert read_log(tmp_path / "none.log") == []
