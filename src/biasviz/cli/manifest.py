"""What ``make figures`` built, by content: so that it rebuilds an output something else replaced.

``make`` decides by time stamps alone: a figure replaced by another command (a README example run into
``figures/``, an ``extract --force`` over ``data/alibi.h5``) is newer than its inputs, and ``make`` would
keep it. After a build, ``record`` stores the SHA-256 of every file under the build's folders with the
make target that wrote it; before the next, ``stale`` gives each target whose files changed or went
missing the time stamp 0, so ``make`` rebuilds it (and everything made from it).

    python -m biasviz.cli.manifest record MANIFEST runs data figures
    python -m biasviz.cli.manifest stale MANIFEST
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from biasviz.common.atomic import write_text
from biasviz.common.hashing import sha256_file
from biasviz.common.jsondoc import loads


def target_of(path: Path, runs: Path, figures: Path) -> Path:
    """The make target that writes ``path``."""
    if path.is_relative_to(runs) and len(path.relative_to(runs).parts) >= 2:
        return runs / path.relative_to(runs).parts[0] / "model.safetensors"  # a checkpoint folder is one target
    if path.parent == figures:
        stem = path.name.rsplit(".", 1)[0]
        for pattern, target in ((r"(.+)_(bias|weights)", "{}_bias.pdf"), (r"(.+)_dynamics", "{}_dynamics.pdf"),
                                (r"long_context", "long_context.pdf")):  # fmt: skip
            m = re.fullmatch(pattern, stem)
            if m:
                return figures / target.format(*m.groups()[:1])
        if re.fullmatch(r".+_profile|diagnostics", stem):
            return figures / "diagnostics.pdf"
    return path


def record(manifest: Path, runs: Path, data: Path, figures: Path) -> int:
    """Store the hash and target of every file under the three folders (previews and stage files apart)."""
    entries = {}
    for root in (runs, data, figures):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
            if "stages" in path.relative_to(root).parts[:1] or "preview" in path.relative_to(root).parts[:1]:
                continue
            entries[str(path)] = {"sha256": sha256_file(path), "target": str(target_of(path, runs, figures))}
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
    doc = loads(manifest.read_text(encoding="utf-8"), str(manifest))
    touched: dict[Path, Path] = {}
    for name, entry in doc["files"].items():
        path, target = Path(name), Path(entry["target"])
        if target in touched or (path.is_file() and sha256_file(path) == entry["sha256"]):
            continue
        if target.exists():
            os.utime(target, (0, 0))
            touched[target] = path
    return list(touched.items())


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "record":
        n = record(Path(argv[1]), Path(argv[2]), Path(argv[3]), Path(argv[4]))
        print(f"recorded {n} built files in {argv[1]}")
        return 0
    if len(argv) == 2 and argv[0] == "stale":
        for target, changed in stale_files(Path(argv[1])):
            why = "is gone" if not changed.exists() else "was replaced (its content differs)"
            print(f"{changed} {why} since the last build: rebuilding {target}")
        return 0
    print("usage: python -m biasviz.cli.manifest record MANIFEST RUNS DATA FIGURES | stale MANIFEST", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
