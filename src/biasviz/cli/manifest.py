"""What ``make figures`` built, by content: so that it rebuilds an output something else replaced, and so that
``make clean`` removes what it built and nothing else.

``make`` decides by time stamps alone: a figure replaced by another command (a README example run into
``figures/``, an ``extract --force`` over ``data/alibi.h5``) is newer than its inputs, and ``make`` would
keep it. Each step of the build logs every file it writes, with its SHA-256 and its make target
(:mod:`biasviz.common.written`); after a build, ``record`` adds that log to the manifest. Before the next,
``stale`` gives each target whose files changed or went missing the time stamp 0, so ``make`` rebuilds it
(and everything made from it). ``clean`` removes exactly the files the manifest and the log list, each only
while its content is the one recorded: never a file by the look of its name, so a user's
``plot --kind profile`` output or a file made by hand beside the build's stays.

    python -m biasviz.cli.manifest record MANIFEST LOG RUNS DATA FIGURES
    python -m biasviz.cli.manifest stale MANIFEST
    python -m biasviz.cli.manifest clean MANIFEST LOG RUNS DATA FIGURES
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from biasviz.common.atomic import write_text
from biasviz.common.hashing import sha256_file
from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import loads
from biasviz.common.written import read_log

#: The manifest's format: 2 lists only files a build's steps logged as written. A manifest without it (format 1)
#: was filled by matching names, so it may list a user's files: ``clean`` removes nothing it lists.
FORMAT = 2


def _key(path: str | Path) -> str:
    """A path as the manifest spells it: relative to the current folder when inside it (the tree can move)."""
    absolute = os.path.abspath(path)
    here = os.getcwd()
    return os.path.relpath(absolute, here) if Path(absolute).is_relative_to(here) else absolute


def _matches(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a regular file whose content is still the one recorded."""
    try:
        return path.is_file() and not path.is_symlink() and sha256_file(path) == sha256
    except OSError:
        return False


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path`` lies under one of ``roots`` (however spelled): a hand-edited manifest reaches no further."""
    where = path.resolve()
    return any(where.is_relative_to(r.resolve()) for r in roots)


@dataclass
class Manifest:
    """The files of a build: path -> {sha256, target}; ``legacy`` when it was filled by matching names."""

    files: dict[str, dict[str, str]] = field(default_factory=dict)
    legacy: bool = False

    @classmethod
    def read(cls, manifest: Path) -> Manifest:
        if not manifest.is_file():
            return cls()
        doc = loads(read_text(manifest, "build manifest"), str(manifest))
        files = {str(k): {"sha256": str(v.get("sha256", "")), "target": str(v.get("target", ""))}
                 for k, v in doc.get("files", {}).items() if isinstance(v, dict)}  # fmt: skip
        return cls(files, legacy=doc.get("format") != FORMAT)


def record(manifest: Path, log: Path, runs: Path, data: Path, figures: Path) -> int:
    """Add the files ``log`` lists (under the three folders, content unchanged since written) to the manifest,
    keep its earlier files that are unchanged, and empty the log. Returns the number of files recorded."""
    roots = [runs, data, figures]
    before = Manifest.read(manifest)
    entries = {} if before.legacy else {k: v for k, v in before.files.items() if _matches(Path(k), v["sha256"])}
    for entry in read_log(log):
        path = Path(entry["path"])
        if _inside(path, roots) and _matches(path, entry["sha256"]):
            entries[_key(path)] = {"sha256": entry["sha256"], "target": entry["target"] or _key(path)}
    folders = {"runs": str(runs), "data": str(data), "figures": str(figures)}
    doc = {"format": FORMAT, "folders": folders, "files": entries}
    write_text(manifest, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    if log.is_file():
        log.unlink()
    return len(entries)


def stale(manifest: Path) -> list[Path]:
    """Give every target whose files differ from the manifest the time stamp 0; return those targets."""
    return [target for target, _ in stale_files(manifest)]


def stale_files(manifest: Path) -> list[tuple[Path, Path]]:
    """(target, the first of its files that changed or went missing) for every target dated back."""
    touched: dict[Path, Path] = {}
    for name, entry in Manifest.read(manifest).files.items():
        path, target = Path(name), Path(entry["target"])
        if target in touched or _matches(path, entry["sha256"]):
            continue
        if target.exists():
            os.utime(target, (0, 0))
            touched[target] = path
    return list(touched.items())


@dataclass
class Cleaned:
    """What ``clean`` did: the files removed, those kept because their content changed, and whether the
    manifest was a legacy one (kept whole)."""

    removed: list[Path] = field(default_factory=list)
    changed: list[Path] = field(default_factory=list)
    legacy: int = 0


def clean(manifest: Path, log: Path, runs: Path, data: Path, figures: Path) -> Cleaned:
    """Remove the files the manifest and the log list, each only while its content is the recorded one, then the
    folders this leaves empty (up to and including the three roots). A file of the user's is never listed, and a
    listed file replaced since (same name, other content) is the user's now: both stay."""
    roots = [runs, data, figures]
    before = Manifest.read(manifest)
    done = Cleaned(legacy=len(before.files) if before.legacy else 0)
    listed = {} if before.legacy else {k: v["sha256"] for k, v in before.files.items()}
    listed |= {_key(e["path"]): e["sha256"] for e in read_log(log)}
    for name, sha256 in listed.items():
        path = Path(name)
        if not _inside(path, roots) or not (path.exists() or path.is_symlink()):
            continue
        if _matches(path, sha256):
            path.unlink()
            done.removed.append(path)
        else:
            done.changed.append(path)
    resolved = [r.resolve() for r in roots]
    for path in done.removed:
        for folder in path.resolve().parents:
            if not folder.is_dir():  # emptied and removed already, from another of its files
                continue
            if not any(folder.is_relative_to(r) for r in resolved) or any(folder.iterdir()):
                break
            folder.rmdir()
    return done


def _report(done: Cleaned, manifest: Path) -> None:
    print(f"removed {len(done.removed)} files made by make figures")
    for path in done.changed:
        print(f"kept {path}: its content changed since make figures wrote it", file=sys.stderr)
    if done.legacy:
        print(f"kept the {done.legacy} files {manifest} lists: it was written by an older biasviz, which matched "
              "files by name and may list yours; remove what you no longer need by hand", file=sys.stderr)  # fmt: skip


USAGE = "usage: python -m biasviz.cli.manifest record|clean MANIFEST LOG RUNS DATA FIGURES | stale MANIFEST"


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] in ("record", "clean"):
        manifest, log, runs, data, figures = map(Path, argv[1:6])
        if argv[0] == "clean":
            _report(clean(manifest, log, runs, data, figures), manifest)
            return 0
        n = record(manifest, log, runs, data, figures)
        print(f"recorded {n} built files in {manifest}")
        return 0
    if len(argv) == 2 and argv[0] == "stale":
        for target, changed in stale_files(Path(argv[1])):
            why = "is gone" if not changed.exists() else "was replaced (its content differs)"
            print(f"{changed} {why} since the last build: rebuilding {target}")
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
