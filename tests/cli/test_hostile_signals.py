"""Every signal that ends a run unwinds it alike: SIGHUP (a closed terminal or SSH session) as SIGTERM and Ctrl-C
do, so a summary's temporary file and its lock are removed and the target is left as it was."""

from __future__ import annotations

import resource
import signal
import subprocess
from pathlib import Path

import pytest

from biasviz.data import build_tokenizer, save_tokenizer
from tests.cli.test_cli_interrupts import BIASVIZ, TEXT, _wait_for_temp
from tests.conftest import small_model
from tests.hostile import CHILD_MEMORY

TIMEOUT = 60  # seconds a signalled run may take to end


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hup")
    small_model("alibi", vocab_size=300).save_pretrained(root / "alibi")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "alibi")
    (root / "text.txt").write_text(TEXT)
    return root


def _argv(ckpt: Path, out: Path, samples: int = 64) -> list[str]:
    return [str(BIASVIZ), "extract", "--model", str(ckpt / "alibi"), "--text", str(ckpt / "text.txt"), "--summary",
            "--seq-len", "64", "--samples", str(samples), "--layer", "all", "--quiet", "--out", str(out)]  # fmt: skip


def _limits(ignore_hup: bool) -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (CHILD_MEMORY, CHILD_MEMORY))
    if ignore_hup:  # as nohup starts a command
        signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_sighup_mid_write_leaves_nothing_behind(ckpt: Path, tmp_path: Path) -> None:
    """Old code: SIGHUP killed the process as it wrote: the temporary file and the lock stayed."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(_argv(ckpt, out / "s.h5"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: _limits(False))  # fmt: skip
    caught = _wait_for_temp(proc, out)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=TIMEOUT)
    left = sorted(p.name for p in out.iterdir())
    if proc.returncode == 0:  # it finished before the signal came: then the file is whole
        assert left == ["s.h5"], left
        return
    assert caught
    assert left == [], f"left behind: {left}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith("Error: interrupted"), err


def test_sighup_ignored_at_start_stays_ignored(ckpt: Path, tmp_path: Path) -> None:
    """Under nohup a hang-up must not stop the run: it ends with its whole file."""
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(_argv(ckpt, out / "s.h5", samples=16), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: _limits(True))  # fmt: skip
    _wait_for_temp(proc, out)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["s.h5"]
