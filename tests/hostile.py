"""What every hostile-input case checks: one ``Error:`` line, the right exit code, and nothing of the user's changed.

A case is a command line with ``{placeholders}`` (the shared files of a module fixture, and ``{tmp}``, the
case's own folder), an optional ``prepare`` that puts the user's files into ``{tmp}`` first, and the
pattern the single stderr line must match. Every file under the shared folder and ``{tmp}`` is hashed
before and after: a failed command must leave them exactly as they were, and add nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import shlex
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BIASVIZ = Path(sys.executable).with_name("biasviz")
CHILD_MEMORY = 4 << 30  # bytes of data a case may allocate (a regression must fail its case, not fill the machine)
SUBPROCESS_TIMEOUT = 60  # seconds; a command that hangs on a FIFO or a crafted file fails its case, not the run
# (in this process through an alarm, where the blocking read is Python's; in a child where it is a library's)


@dataclass(frozen=True)
class Case:
    name: str
    argv: str  # shlex-split after formatting with the fixture's paths and {tmp}
    pattern: str  # the one stderr line must match this (re.search)
    code: int = 1
    prepare: Callable[[Path, dict[str, str]], object] | None = None  # makes the user's files under {tmp}
    subprocess: bool = False  # run the installed script (for cases that could hang or must not share a process)
    level: str = "Error"  # "Warning" for cases that succeed with one warning line

    def __str__(self) -> str:
        return self.name


def snapshot(*roots: Path) -> dict[str, str]:
    """Every path under ``roots``: its type, mode and (files) content hash; symlinks by their target."""
    found: dict[str, str] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode):
                    found[str(p)] = f"link {os.readlink(p)}"
                elif stat.S_ISREG(st.st_mode):
                    found[str(p)] = f"{st.st_mode:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
                else:
                    found[str(p)] = f"{st.st_mode:o}"
    return found


def argv_of(case: Case, paths: dict[str, str], tmp: Path) -> list[str]:
    return shlex.split(case.argv.format(**paths, tmp=shlex.quote(str(tmp))))


def run(argv: list[str], capsys: pytest.CaptureFixture[str], *, in_subprocess: bool = False,
        preexec: Callable[[], None] | None = None, cwd: Path | None = None) -> tuple[int, str, str]:  # fmt: skip
    """(exit code, stdout, stderr) of ``biasviz ARGV``, in this process or the installed script's."""
    if in_subprocess:

        def limits() -> None:  # a command reading /dev/zero to the end must not take the machine's memory
            resource.setrlimit(resource.RLIMIT_DATA, (CHILD_MEMORY, CHILD_MEMORY))
            if preexec is not None:
                preexec()

        try:
            proc = subprocess.run([str(BIASVIZ), *argv], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
                                  preexec_fn=limits, cwd=cwd, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
        except subprocess.TimeoutExpired:
            return -1, "", f"(hung for {SUBPROCESS_TIMEOUT} s)"
        return proc.returncode, proc.stdout, proc.stderr
    from tests.conftest import run_cli

    try:
        with limited(SUBPROCESS_TIMEOUT, _Hung):
            return run_cli(argv, capsys)
    except _Hung:
        return -1, "", f"(hung for {SUBPROCESS_TIMEOUT} s)"


@contextlib.contextmanager
def limited(seconds: int = 60, hung: type[BaseException] = TimeoutError) -> Iterator[None]:
    """A memory and a time limit for an in-process call (a regression fails the test, not the machine): past
    ``seconds`` the alarm raises ``hung`` (a blocking open() of a FIFO returns to it with EINTR)."""

    def alarm(_signum: int, _frame: object) -> None:
        raise hung(f"hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _data_in_use() + CHILD_MEMORY
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _data_in_use() -> int:
    """This process's data segment and private mappings (what RLIMIT_DATA counts), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))


class _Hung(BaseException):
    """Raised by the alarm of an in-process case that blocks (never caught by biasviz, unlike OSError)."""


#: count a case clean when it fails with one Error line and changes nothing, whatever the line says (used to
#: measure a version of biasviz older than the messages these cases expect)
LENIENT = bool(os.environ.get("BIASVIZ_HOSTILE_LENIENT"))


def check(case: Case, code: int, err: str) -> None:
    """One line on stderr, of the case's level, matching its pattern; the exit code the case names."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    if LENIENT:
        assert (code in (1, 2)) if case.code else code == 0, (case.name, code, err)
        assert len(lines) == 1 and lines[0].startswith(f"{case.level}: "), lines
        return
    assert code == case.code, (case.name, code, err)
    assert len(lines) == 1, f"{case.name}: expected one line, got {lines}"
    assert lines[0].startswith(f"{case.level}: "), lines[0]
    assert re.search(case.pattern, lines[0]), f"{case.name}: {lines[0]!r} does not match {case.pattern!r}"


def run_case(case: Case, paths: dict[str, str], tmp: Path, capsys: pytest.CaptureFixture[str],
             preexec: Callable[[], None] | None = None) -> tuple[int, str, str]:  # fmt: skip
    """Prepare, run and check ``case``; the shared files and {tmp} must be unchanged afterwards."""
    if case.prepare is not None:
        case.prepare(tmp, paths)
    before = snapshot(Path(paths["root"]), tmp)
    code, out, err = run(argv_of(case, paths, tmp), capsys, in_subprocess=case.subprocess or preexec is not None,
                         preexec=preexec, cwd=tmp)  # fmt: skip
    check(case, code, err)
    if case.level == "Error":
        assert snapshot(Path(paths["root"]), tmp) == before, f"{case.name}: the user's files changed"
    return code, out, err


TEXT = "\n".join(f"def g{i}(y):\n    return y - {i} * {i + 1}  # row {i}" for i in range(300))


EXTRACT = "extract --model {tmp}/ck --text {text} --seq-len 8 --samples 1 --quiet --out {tmp}/o.h5"


def checkpoint(root: Path, text: str = TEXT) -> dict[str, str]:
    """A tiny ALiBi checkpoint with its tokenizer (``ck``) and a text file of ``text``: what a case's command reads."""
    from biasviz.data import build_tokenizer, save_tokenizer
    from tests.conftest import small_model

    small_model("alibi", vocab_size=300).save_pretrained(root / "ck")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "ck")
    (root / "text.txt").write_text(text)
    return {"root": str(root), "ck": str(root / "ck"), "text": str(root / "text.txt")}


def make_assets(root: Path) -> dict[str, str]:
    """Shared inputs: text, a biasviz checkpoint, a nanoGPT state dict, a small format-1 file."""
    import torch

    from biasviz.data import build_tokenizer, save_tokenizer
    from tests.cli.test_cli_errors import _state_dict
    from tests.conftest import small_model
    from tests.project.test_untrusted import write_valid

    (root / "text.txt").write_text(TEXT)
    tok = build_tokenizer([TEXT], 300)
    small_model("alibi", vocab_size=300).save_pretrained(root / "alibi")
    save_tokenizer(tok, root / "alibi")
    torch.save(_state_dict(vocab_size=300), root / "sd.pt")
    write_valid(root / "good.h5")
    return {"root": str(root), "text": str(root / "text.txt"), "alibi": str(root / "alibi"),
            "sd": str(root / "sd.pt"), "good": str(root / "good.h5")}  # fmt: skip
