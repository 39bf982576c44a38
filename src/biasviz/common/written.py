"""A log of the files a build wrote, so that ``make clean`` removes exactly those and nothing of the user's.

A name says nothing about who wrote a file: ``figures/alibi_bias_profile.pdf`` may be a user's ``plot --kind
profile`` as well as a build's. So ``make figures`` runs each step with ``BIASVIZ_WRITTEN_LOG`` naming a log
file (and ``BIASVIZ_WRITTEN_FOR`` the make target), and every output biasviz moves into place is appended to
it, one JSON line per file with its SHA-256. :mod:`biasviz.cli.manifest` records those lines, and ``clean``
removes a file only when its content is still the one logged.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

LOG_ENV = "BIASVIZ_WRITTEN_LOG"
TARGET_ENV = "BIASVIZ_WRITTEN_FOR"


def _files(target: Path) -> Iterator[Path]:
    """``target``, or every file under it when it is a folder (a checkpoint directory is moved in whole)."""
    if target.is_dir() and not target.is_symlink():
        yield from sorted(p for p in target.rglob("*") if p.is_file() and not p.is_symlink())
    elif target.is_file() and not target.is_symlink():
        yield target


def note_written(target: str | Path) -> None:
    """Append ``target``'s files (path, SHA-256, make target) to the log the environment names, if any."""
    log = os.environ.get(LOG_ENV)
    if not log:
        return
    from biasviz.common.hashing import sha256_file

    made_for = os.environ.get(TARGET_ENV, "")
    lines = "".join(json.dumps({"path": os.path.abspath(p), "sha256": sha256_file(p), "target": made_for}) + "\n"
                    for p in _files(Path(target)))  # fmt: skip
    try:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            os.write(fd, lines.encode("utf-8", "surrogateescape"))  # one append: parallel steps do not interleave
        finally:
            os.close(fd)
    except OSError as exc:  # the output is in place; only its record is missing, so `make clean` keeps it
        print(f"note: could not log {target} in {log} ({exc.strerror}); make clean will keep it", file=sys.stderr)


def read_log(log: Path) -> list[dict[str, str]]:
    """The entries of a log (later lines win for the same path); a missing log has none."""
    if not log.is_file():
        return []
    entries: dict[str, dict[str, str]] = {}
    for line in log.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a line cut short by a killed step: that file is not known to be the build's
            continue
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("sha256"), str):
            entries[entry["path"]] = {k: str(entry.get(k, "")) for k in ("path", "sha256", "target")}
    return list(entries.values())


__all__ = ["LOG_ENV", "TARGET_ENV", "note_written", "read_log"]
