"""One writer per output: a second biasviz process writing the same file or folder fails at once.

The lock is an advisory ``flock`` on a hidden file beside the output, held while the output is written.
The kernel releases it when its process ends however it ends (SIGKILL, the out-of-memory killer), so a
killed run never blocks the next one; and the next run, once it holds the lock, removes the temporary
files that killed runs left behind (their process is gone, and nobody else may be writing there).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from biasviz.common.atomic import open_beside, remove_stale_temporaries, temporary_prefix
from biasviz.common.errors import BiasvizError, os_error_message
from biasviz.common.outputs import make_output_folder


def lock_name(target: Path) -> Path:
    """The hidden lock file of ``target`` (as short as the temporary names, for names at the length limit)."""
    return target.with_name(f"{temporary_prefix(target)}lock")


_HELD: dict[Path, int] = {}  # locks this process holds, and how deep: a command and its writer share one


@contextlib.contextmanager
def writing_alone(target: str | Path, option: str = "--out") -> Iterator[None]:
    """Hold ``target``'s lock for the block; another process holding it is one clear error, at once.

    Re-entrant within a process (the command takes the lock before loading a model, its writer again).
    """
    target = Path(target)
    lock = lock_name(target)
    key = lock.parent.resolve() / lock.name
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    while True:
        make_output_folder(target.parent, option)  # the output's folder, as its writer would make it
        try:
            fd = open_beside(lock, new=False)  # never through a link planted there
        except OSError as exc:  # an unwritable folder: name the output the user gave, not the lock file
            raise BiasvizError(os_error_message(exc, target)) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BiasvizError(f"another biasviz process is writing {target}; wait for it to finish or choose "
                               f"another {option}") from None  # fmt: skip
        try:  # the holder before us may have removed the lock file as it finished: then lock the new one
            current = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    _HELD[key] = 1
    try:
        remove_stale_temporaries(target)
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


__all__ = ["lock_name", "writing_alone"]
