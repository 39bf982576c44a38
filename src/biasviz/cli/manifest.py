"""What ``make figures`` built, by content: so that it rebuilds an output something else replaced.

``make`` decides by time stamps alone: a figure replaced by another command (a README example run into
``figures/``, an ``extract --force`` over ``data/alibi.h5``) is newer than its inputs, and ``make`` would
keep it. After a build, ``record`` stores the SHA-256 of every file of the build's own targets with the
make target that wrote it (a user's ``runs/mine`` or ``data/mine.h5`` beside them is no target: never
recorded); before the next, ``stale`` gives each target whose files changed or went missing the time stamp
0, so ``make`` rebuilds it (and everything made from it). ``clean`` removes what the build made (the
manifest's files and its targets' files), and nothing else under the same folders.

    python -m biasviz.cli.manifest record MANIFEST runs data figures TARGET...
    python -m biasviz.cli.manifest stale MANIFEST
    python -m biasviz.cli.manifest clean MANIFEST runs data figures TARGET...
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from biasviz.common.atomic import write_text
from biasviz.common.hashing import sha256_file
from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import loads


def target_of(path: Path, runs: Path, figures: Path) -> Path:
    """The make target that writes ``path``."""
    if path.is_relative_to(runs) and len(path.relative_to(runs).parts) >= 2:
        return runs / path.relative_to(runs).parts[0] / "model.safetensors"  # a checkpoint folder is one target
    if path.parent == figures:
        stem = path.name.rsplit(".", 1)[0]
        for pattern, target in ((r"(.+)_(bias|weights)", "{}_bias.pdf"), (r"(.+)_dynamics", "{}_dynamics.pdf"),
                                (r"long_context", "long_context.pdf"), (r"positional", "positional.pdf"),
                                (r"position_measures", "position_measures.pdf")):  # fmt: skip
            m = re.fullmatch(pattern, stem)
            if m:
                return figures / target.format(*m.groups()[:1])
        if re.fullmatch(r".+_profile|.+_training|diagnostics", stem):
            return figures / "diagnostics.pdf"
    return path


def built_files(runs: Path, data: Path, figures: Path, targets: Iterable[Path] | None = None) -> list[Path]:
    """The files under the three folders that ``targets`` wrote (None: every file), previews and stage files
    apart: a file counts when :func:`target_of` maps it to one of the targets, so a user's own run or file
    beside them (``runs/mine``, ``data/mine.h5``) never does."""
    wanted = None if targets is None else {Path(t) for t in targets}
    found = []
    for root in (runs, data, figures):
        if not root.is_dir():
            continue
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
            if "stages" in path.relative_to(root).parts[:1] or "preview" in path.relative_to(root).parts[:1]:
                continue
            if wanted is None or target_of(path, runs, figures) in wanted:
                found.append(path)
    return found


def record(manifest: Path, runs: Path, data: Path, figures: Path, targets: Iterable[Path] | None = None) -> int:
    """Store the hash and target of every file of ``targets`` (None: every file) under the three folders."""
    entries = {str(path): {"sha256": sha256_file(path), "target": str(target_of(path, runs, figures))}
               for path in built_files(runs, data, figures, targets)}  # fmt: skip
    folders = {"runs": str(runs), "data": str(data), "figures": str(figures)}
    write_text(manifest, json.dumps({"folders": folders, "files": entries}, indent=1, sort_keys=True) + "\n")
    return len(entries)


def stale(manifest: Path) -> list[Path]:
    """Give every target whose files differ from the manifest the time stamp 0; return those targets."""
    return [target for target, _ in stale_files(manifest)]


def stale_files(manifest: Path) -> list[tuple[Path, Path]]:
    """(target, the first of its files that changed or went missing) for every target dated back."""
    if not manifest.is_file():
        return []
    doc = loads(read_text(manifest, "build manifest"), str(manifest))
    touched: dict[Path, Path] = {}
    for name, entry in doc["files"].items():
        path, target = Path(name), Path(entry["target"])
        if target in touched or (path.is_file() and sha256_file(path) == entry["sha256"]):
            continue
        if target.exists():
            os.utime(target, (0, 0))
            touched[target] = path
    return list(touched.items())


def clean(manifest: Path, runs: Path, data: Path, figures: Path, targets: Iterable[Path]) -> list[Path]:
    """Remove what the build made: the files its manifest lists and the files of ``targets``, then the folders
    this leaves empty; a file of the user's under the same folders stays, and so do its folders. Returns the
    files removed."""
    roots = [r.resolve() for r in (runs, data, figures)]
    listed = []
    if manifest.is_file():
        doc = loads(read_text(manifest, "build manifest"), str(manifest))
        listed = [Path(name) for name in doc["files"]]
    removed = []
    for path in dict.fromkeys([*listed, *built_files(runs, data, figures, targets)]):
        inside = any(path.resolve().is_relative_to(r) for r in roots)  # a hand-edited manifest reaches no further
        if inside and path.is_file():
            path.unlink()
            removed.append(path)
    for path in removed:  # folders left empty, up to and including the three roots
        for folder in path.resolve().parents:
            if not folder.is_dir():  # emptied and removed already, from another of its files
                continue
            if not any(folder.is_relative_to(r) for r in roots) or any(folder.iterdir()):
                break
            folder.rmdir()
    return removed


def main(argv: list[str]) -> int:
    if len(argv) >= 5 and argv[0] in ("record", "clean"):
        manifest, runs, data, figures = map(Path, argv[1:5])
        targets = [Path(t) for t in argv[5:]]
        if argv[0] == "clean":
            print(f"removed {len(clean(manifest, runs, data, figures, targets))} files made by make figures")
            return 0
        n = record(manifest, runs, data, figures, targets or None)
        print(f"recorded {n} built files in {argv[1]}")
        return 0
    if len(argv) == 2 and argv[0] == "stale":
        for target, changed in stale_files(Path(argv[1])):
            why = "is gone" if not changed.exists() else "was replaced (its content differs)"
            print(f"{changed} {why} since the last build: rebuilding {target}")
        return 0
    print("usage: python -m biasviz.cli.manifest record|clean MANIFEST RUNS DATA FIGURES [TARGET...] | stale MANIFEST",
          file=sys.stderr)  # fmt: skip
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
