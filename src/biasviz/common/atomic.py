"""Writing files so that a reader never sees half of one: write beside the target, then move it into place.

Every output of biasviz (HDF5 files, figures, JSON, checkpoint directories, previews, stage files) goes
through :func:`replacing`: an interruption, a full disk or any error leaves the old target untouched
and no temporary file behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from biasviz.common.ending import ENDING
from biasviz.common.written import note_written

#: Longest name (bytes) kept whole in a temporary name; beyond it the name is cut and a hash added, so that
#: the hidden name (".NAME.PID.tmp") stays within the file system's 255 bytes whenever NAME itself does.
NAME_ROOM = 236


def temporary_prefix(target: Path) -> str:
    """``.NAME.``: the start of every temporary (and lock) name of ``target``."""
    name = target.name
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > NAME_ROOM:
        import hashlib

        cut = raw[: NAME_ROOM - 9].decode("utf-8", "ignore")
        name = f"{cut}~{hashlib.sha256(raw).hexdigest()[:8]}"
    return f".{name}."


def temporary_name(target: Path, suffix: str = "") -> Path:
    """A hidden name beside ``target``, unique to this process (same file system, so the move is atomic).

    ``.NAME.PID.tmp`` (``suffix`` after it for tools that go by the extension): the process id tells a
    later run whether the file's writer is gone (:func:`remove_stale_temporaries`).
    """
    return target.with_name(f"{temporary_prefix(target)}{os.getpid()}.tmp{suffix}")


_after_publish: list[Callable[[], None]] = []  # what a command does once its output is in place (cli.output_in_place)


def when_published(hook: Callable[[], None]) -> None:
    """Call ``hook`` right after the next output is moved into place, with the signals that end a run held back across
    the move and the hook: a signal that comes as the file lands is handled by what the hook set (an extract
    whose output is in place ignores it rather than report the old file kept)."""
    _after_publish.append(hook)


def publish(tmp: Path, target: Path, *, overwrite: bool = True) -> None:
    """Move ``tmp`` to ``target``; without ``overwrite`` raise FileExistsError rather than replace a file.

    Without ``overwrite`` the move is a hard link, which fails if the target appeared in the meantime
    (no check-then-write race); file systems without hard links fall back to a checked rename. Hooks of
    :func:`when_published` run right after the move, signals held back across both.
    """
    if not _after_publish or threading.current_thread() is not threading.main_thread():
        _move(tmp, target, overwrite)
        note_written(target)
        return
    # Python runs signal handlers in the main thread between bytecodes, whichever thread the kernel delivered
    # them to (masking this thread alone would not stop torch's or a pool's threads from taking them): a handler
    # that only notes the signal holds it back; it is handled once the hooks have said how
    held = ENDING
    noted: list[int] = []

    def note(signum: int, _frame: object) -> None:
        noted.append(signum)

    before = {s: signal.signal(s, note) for s in held}
    try:
        _move(tmp, target, overwrite)
        while _after_publish:
            _after_publish.pop(0)()
    finally:
        for s, handler in before.items():
            if signal.getsignal(s) is note:  # a hook that set its own (SIG_IGN) keeps it
                signal.signal(s, handler)
        for signum in noted:
            _handle(signum)
    note_written(target)


def _handle(signum: int) -> None:
    """A signal held back, handled as the process now would: its handler called, ignored, or the default."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def _move(tmp: Path, target: Path, overwrite: bool) -> None:
    if overwrite:
        if target.is_dir() and tmp.is_dir():
            shutil.rmtree(target)
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target, follow_symlinks=False)  # atomic, fails if the target exists
    except FileExistsError:
        raise
    except OSError:  # no hard links here (or a directory): a rename that refuses to replace, where there is one
        if not _rename_noreplace(tmp, target):
            if target.exists() or target.is_symlink():
                raise FileExistsError(target) from None
            os.replace(tmp, target)
        return
    tmp.unlink()


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (Linux ``renameat2(RENAME_NOREPLACE)``), in one step.

    True when renamed; FileExistsError when ``dst`` exists; False where the system has no such call.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):
        return False
    at_fdcwd, noreplace = -100, 1
    if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EEXIST:
        raise FileExistsError(code, os.strerror(code), str(dst))
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # not this system or file system
        return False
    raise OSError(code, os.strerror(code), str(dst))


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove the temporary files of ``target`` whose process has ended (a killed run's), and no other."""
    prefix = temporary_prefix(target)
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.tmp(\.[a-z]+)?")
    removed = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        remove_path(Path(entry.path))
        removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def replacing(target: str | Path, *, overwrite: bool = True, tmp: Path | None = None,
              option: str = "--out") -> Iterator[Path]:  # fmt: skip
    """Yield a temporary path for ``target``; move it into place when the block succeeds, remove it otherwise.

    Without ``overwrite`` the move fails if ``target`` exists, in one step (:func:`publish`): a file another
    process made meanwhile is kept, and the error names ``option``.

    The temporary path is a file name or, if the block makes a directory there, a directory.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> with replacing(d / "a.txt") as t:
    ...     _ = t.write_text("done")
    >>> (d / "a.txt").read_text(), sorted(p.name for p in d.iterdir())
    ('done', ['a.txt'])
    """
    target = Path(target)
    remove_stale_temporaries(target)
    tmp = temporary_name(target) if tmp is None else tmp
    remove_path(tmp)
    try:
        yield tmp
        try:
            publish(tmp, target, overwrite=overwrite)
        except FileExistsError:
            from biasviz.common.outputs import appeared_meanwhile

            raise appeared_meanwhile(target, option) from None
    finally:
        if tmp.exists() or tmp.is_symlink():
            remove_path(tmp)


def open_beside(path: str | Path, *, new: bool = True, mode: int = 0o666) -> int:
    """A descriptor (read-write) of a file biasviz makes beside an output: a temporary file, a lock, a manifest.

    Never through a symbolic link planted at that name: ``O_NOFOLLOW`` refuses one (dangling or not) rather
    than create a file at its target, outside the output's folder; ``new`` adds ``O_EXCL``, so that a file
    that appeared meanwhile is an error, never written through. Only a regular file is ever returned (a FIFO
    or device planted at a lock's name is refused, not opened for good). The one way biasviz opens them.
    """
    from biasviz.common.errors import BiasvizError

    path = Path(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_EXCL if new else 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and path.is_symlink()):
            raise BiasvizError(f"{path} is a symbolic link where biasviz keeps its own file; remove it (biasviz "
                               "never follows a link there)") from None  # fmt: skip
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BiasvizError(f"{path} is not a regular file where biasviz keeps its own file; remove it")
    os.set_blocking(fd, True)
    return fd


def write_new(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, a new file made by :func:`open_beside` (never a link's target)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with os.fdopen(open_beside(path), "wb") as f:
        f.write(raw)


def write_text(target: str | Path, text: str) -> None:
    """Replace ``target`` with ``text`` (UTF-8) atomically."""
    with replacing(target) as tmp:
        write_new(tmp, text)


class Staged:
    """Files written under temporary names and moved into place together: a figure set is replaced whole.

    Until :meth:`publish`, every target keeps its old content; :meth:`discard` removes what was written.
    """

    def __init__(self, inputs: Iterable[str | Path | None] = (), *, overwrite: bool = True,
                 option: str = "--out-dir") -> None:  # fmt: skip
        self._moves: list[tuple[Path, Path]] = []
        self._new: dict[Path, str] = {}  # targets never overwritten, and the option that names each
        self._inputs = list(inputs)  # files the outputs are made from: never a target
        self._overwrite, self._option = overwrite, option  # the set's default: may it replace existing files?

    def temporary(self, target: str | Path, *, overwrite: bool | None = None, option: str | None = None) -> Path:
        """A temporary path for ``target``, moved there by :meth:`publish`; without ``overwrite`` (the set's
        default when None) an existing ``target`` is an error now, and a file that appeared there meanwhile is
        kept and the whole set not published (``option`` names the option to change)."""
        from biasviz.common.errors import BiasvizError
        from biasviz.common.outputs import check_inputs_kept, check_no_loop

        target = Path(target)
        overwrite = self._overwrite if overwrite is None else overwrite
        option = self._option if option is None else option
        check_no_loop(target, "--out-dir")
        if target.is_dir() and not target.is_symlink():
            raise BiasvizError(f"{target} is a folder; move it away or choose another --out-dir")
        check_inputs_kept(target, self._inputs, "--out-dir")
        if not overwrite and (target.exists() or target.is_symlink()):
            raise BiasvizError(f"{target} already exists; pass --force to overwrite it or choose another {option}")
        remove_stale_temporaries(target)
        tmp = temporary_name(target)
        remove_path(tmp)
        self._moves.append((tmp, target))
        if not overwrite:
            self._new[tmp] = option
        return tmp

    def publish(self) -> None:
        """Move every file into place (renames within one folder: quick, and no space is needed).

        The files that must not overwrite go first, each in one step that fails if its target exists: a
        second process that won the race keeps its file, and nothing of this set replaces anything.
        """
        from biasviz.common.errors import BiasvizError, os_error_message
        from biasviz.common.outputs import appeared_meanwhile

        self._moves.sort(key=lambda move: move[0] not in self._new)
        while self._moves:
            tmp, target = self._moves[0]
            try:
                if tmp in self._new:
                    publish(tmp, target, overwrite=False)  # which logs what it wrote
                else:
                    os.replace(tmp, target)
                    note_written(target)
            except FileExistsError:
                raise appeared_meanwhile(target, self._new.get(tmp, "--out")) from None
            except OSError as exc:
                raise BiasvizError(os_error_message(exc, target)) from exc
            self._moves.pop(0)

    def discard(self) -> None:
        for tmp, _ in self._moves:
            remove_path(tmp)
        self._moves.clear()


@contextlib.contextmanager
def replacing_together(inputs: Iterable[str | Path | None] = (), *, overwrite: bool = True) -> Iterator[Staged]:
    """A :class:`Staged` set (refusing to replace any of ``inputs``, and any existing file without
    ``overwrite``), published when the block succeeds and discarded otherwise."""
    staged = Staged(inputs, overwrite=overwrite)
    try:
        yield staged
        staged.publish()
    finally:
        staged.discard()
