"""One writer per output (:mod:`biasviz.common.exclusive`): an advisory ``flock`` on ``.NAME.lock`` beside the
output, held for the block and gone after it; re-entrant in one process; another holder refused at once; a killed
holder blocks nothing; and the holder clears the temporaries of runs that are gone, and only theirs."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.common.exclusive import lock_name, writing_alone


def held_elsewhere(lock: Path) -> bool:
    """Whether another open file holds ``lock``: flock conflicts between two opens, even in one process."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_lock_is_a_hidden_file_beside_the_output(tmp_path: Path) -> None:
    assert lock_name(tmp_path / "out.h5") == tmp_path / ".out.h5.lock"
    assert lock_name(Path("figs")) == Path(".figs.lock")


def test_the_lock_is_held_for_the_block_and_removed_after(tmp_path: Path) -> None:
    target = tmp_path / "new" / "folder" / "out.h5"
    lock = tmp_path / "new" / "folder" / ".out.h5.lock"
    with writing_alone(target):
        assert (tmp_path / "new" / "folder").is_dir()  # its folder made, as the writer would
        assert lock.is_file() and held_elsewhere(lock)
    assert not lock.exists() and not target.exists()
    with pytest.raises(RuntimeError), writing_alone(target):
        raise RuntimeError("the writer failed")
    assert not lock.exists()


def test_one_process_takes_its_own_lock_again(tmp_path: Path) -> None:
    """The command holds the lock, its writer takes it again; the lock stays until the outer block ends."""
    target = tmp_path / "out.h5"
    with writing_alone(target):
        with writing_alone(str(tmp_path / "." / "out.h5")):  # however spelled
            pass
        assert held_elsewhere(tmp_path / ".out.h5.lock")
    assert not (tmp_path / ".out.h5.lock").exists()


def test_another_holder_is_refused_at_once(tmp_path: Path) -> None:
    target = tmp_path / "out.h5"
    other = os.open(tmp_path / ".out.h5.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(BiasvizError) as refused, writing_alone(target, "--summary"):
            pass
        assert str(refused.value) == (f"another biasviz process is writing {target}; wait for it to finish or choose "
                                      "another --summary")  # fmt: skip
    finally:
        os.close(other)
    assert (tmp_path / ".out.h5.lock").exists()  # the other holder's file: left for it


def test_a_killed_holder_blocks_nothing(tmp_path: Path) -> None:
    """A child takes the lock and is killed (SIGKILL, no clean-up): the kernel lets the lock go with it."""
    lock = tmp_path / ".out.h5.lock"
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX);"
            "print('held', flush=True); sys.stdin.read()")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-I", "-c", code, str(lock)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        with pytest.raises(BiasvizError, match="another biasviz process is"), writing_alone(tmp_path / "out.h5"):
            pass
    finally:
        child.kill()
        child.wait(timeout=5)
    with writing_alone(tmp_path / "out.h5"):
        assert held_elsewhere(lock)


def test_the_holder_removes_the_temporaries_of_runs_that_are_gone(tmp_path: Path) -> None:
    ended = subprocess.Popen([sys.executable, "-I", "-c", "pass"])
    ended.wait()  # its process id names a run that is gone
    gone = ended.pid
    stale = [tmp_path / f".out.h5.{gone}.tmp", tmp_path / f".out.h5.{gone}.tmp.png", tmp_path / f".out.h5.{gone}.tmp.d"]
    kept = [tmp_path / f".out.h5.{os.getpid()}.tmp",  # this process's own
            tmp_path / f".out.h5.{os.getppid()}.tmp",  # a live process's
            tmp_path / f".other.h5.{gone}.tmp",  # another output's
            tmp_path / f".out.h5.{gone}.tmp.2",  # not a temporary's name: its extension is letters
            tmp_path / "out.h5"]  # fmt: skip
    for path in stale[:2] + kept:
        path.write_text("")
    stale[2].mkdir()
    (stale[2] / "part").write_text("")  # a killed run's folder, whole
    with writing_alone(tmp_path / "out.h5"):
        left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([p.name for p in kept] + [".out.h5.lock"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_an_unwritable_folder_names_the_output(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(BiasvizError, match=r"^cannot write .*ro/out\.h5: Permission denied; check its perm"), \
                writing_alone(folder / "out.h5"):
            pass
    finally:
        folder.chmod(0o700)
