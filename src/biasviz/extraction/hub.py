"""Checkpoint series of public models, read from the local Hugging Face cache only (nothing is downloaded).

``--model ORG/NAME --checkpoints ...`` lists the branches and tags the cache knows for ORG/NAME (the files
``models--ORG--NAME/refs/<name>`` that ``hf download ORG/NAME --revision <name>`` leaves), keeps those whose
names give a step (:mod:`biasviz.training.series`), and resolves each to its snapshot folder with
``huggingface_hub.snapshot_download(..., local_files_only=True)``. A revision whose snapshot lacks its config or
weights is not on disk; asking for it is one ``Error:`` line saying how to fetch it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from biasviz.adapters.files import PARAMETER_FILE_PATTERNS
from biasviz.common.errors import BiasvizError
from biasviz.training.series import Checkpoint, ordered, parse_name

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def cache_dir() -> Path:
    """The hub cache, as huggingface_hub finds it: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub.

    Read from the environment at each call (huggingface_hub reads it once, when first imported).
    """
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def is_repo_id(model: str) -> bool:
    """``ORG/NAME`` that is not a path on disk (a local folder of that name wins)."""
    return _REPO_ID.fullmatch(model) is not None and not Path(model).expanduser().exists()


def fetch_hint(repo_id: str, revision: str) -> str:
    return f"fetch it with: hf download {repo_id} --revision {revision} (biasviz reads only what is on disk)"


def _complete(snapshot: Path) -> bool:
    return (snapshot / "config.json").is_file() and any(any(snapshot.glob(p)) for p in PARAMETER_FILE_PATTERNS)


def _snapshot(repo_id: str, revision: str, cache: Path) -> Path | None:
    """The snapshot folder of ``revision``, or None when the cache does not hold it whole."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # set before huggingface_hub is first imported: never a request
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    return path if _complete(path) else None


def hub_series(repo_id: str, pattern: re.Pattern[str] | None = None) -> list[Checkpoint]:
    """Every revision of ``repo_id`` whose name gives a step, by step; ``path`` None where it is not on disk."""
    cache = cache_dir()
    org, name = repo_id.split("/")
    refs = cache / f"models--{org}--{name}" / "refs"
    if not refs.is_dir():
        hint = fetch_hint(repo_id, "REVISION")
        raise BiasvizError(f"--model {repo_id}: not a folder, and the Hugging Face cache ({cache}; set HF_HUB_CACHE "
                           f"or HF_HOME to use another) holds no revisions of it; {hint}")  # fmt: skip
    found = []
    for ref in sorted(p for p in refs.rglob("*") if p.is_file()):
        revision = ref.relative_to(refs).as_posix()
        parsed = parse_name(revision, pattern)
        if parsed is not None:
            found.append(Checkpoint(parsed[0], revision, _snapshot(repo_id, revision, cache), parsed[1]))
    return ordered(found, f"{repo_id} in {cache}")


def missing_revision(repo_id: str, series: list[Checkpoint]) -> Callable[[str], BiasvizError]:
    """The error for a ``--checkpoints`` item naming a revision that is not on disk."""

    def error(item: str) -> BiasvizError:
        named = next((c for c in series if item in (c.name, str(c.step))), None)
        if named is not None:  # a ref without a complete snapshot
            return BiasvizError(f"revision {named.name} of {repo_id} is in the cache only in part (no config.json "
                                f"or weights); {fetch_hint(repo_id, named.name)}")  # fmt: skip
        if item.isdigit() and any(c.tokens is not None for c in series):
            return BiasvizError(f"step {item} of {repo_id} is not on disk; its revision's name carries the tokens "
                                f"(like {series[0].name}): {fetch_hint(repo_id, 'NAME')}")  # fmt: skip
        revision = _name_for(item, series) if item.isdigit() else item
        return BiasvizError(f"revision {revision} of {repo_id} is not on disk; {fetch_hint(repo_id, revision)}")

    return error


def _name_for(step: str, series: list[Checkpoint]) -> str:
    """A step's revision name, written as the last revision present is (``step143000`` -> ``step1000``)."""
    last = series[-1] if series else None
    if last is not None and last.name.endswith(str(last.step)):
        return last.name[: len(last.name) - len(str(last.step))] + step
    return f"step{step}"
