"""What a checkpoint directory written by ``biasviz train`` holds, and what ``--force`` may replace.

``--force`` replaces a biasviz checkpoint, and nothing else: a folder of the user's, another model's
checkpoint, a checkpoint beside which the user keeps notes, or a link, is refused, never deleted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import loads

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
#: every file ``biasviz train`` writes into a checkpoint directory
CHECKPOINT_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE, "tokenizer.json", "training.json"})
MODEL_TYPE = "biasviz_gpt2"
SAVED_STEP = re.compile(r"checkpoint-(\d+)")  # train --save-every's checkpoints, inside the run's directory


def _model_type(directory: Path) -> str | None:
    if not (directory / CONFIG_FILE).is_file():
        return None
    try:
        config = loads(read_text(directory / CONFIG_FILE, CONFIG_FILE), str(directory / CONFIG_FILE))
    except ValueError:
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def check_output(out: Path, force: bool) -> None:
    """Refuse ``out`` unless it is new, an empty folder, or (with ``force``) a biasviz checkpoint and only that."""
    if out.is_symlink():
        raise BiasvizError(f"{out} is a symbolic link; give the checkpoint directory itself as --out")
    if not out.exists():
        return
    if not out.is_dir():
        raise BiasvizError(f"{out} is a file, not a checkpoint directory; choose another --out")
    names = {p.name for p in out.iterdir()}
    if not names:
        return
    if not force:
        raise BiasvizError(f"{out} already exists; pass --force to replace it or choose another --out")
    if CONFIG_FILE not in names or WEIGHTS_FILE not in names or _model_type(out) != MODEL_TYPE:
        raise BiasvizError(f"{out} is not a biasviz checkpoint (no config.json of model type {MODEL_TYPE} with "
                           f"{WEIGHTS_FILE}); --force replaces only those: choose another --out")  # fmt: skip
    foreign = sorted(n for n in names if not _ours(out / n))
    if foreign:
        raise BiasvizError(f"{out} holds files biasviz did not write ({', '.join(foreign[:5])}); "
                           "move them away or choose another --out")  # fmt: skip


def _ours(path: Path) -> bool:
    """A file train writes, or a ``checkpoint-STEP/`` of ``--save-every`` holding only such files."""
    if path.is_symlink():
        return False
    if path.is_file():
        return path.name in CHECKPOINT_FILES
    return (path.is_dir() and SAVED_STEP.fullmatch(path.name) is not None
            and all(p.is_file() and not p.is_symlink() and p.name in CHECKPOINT_FILES for p in path.iterdir()))


def file_mode() -> int:
    """The mode a new file gets under this process's umask (0o644 under the usual 022)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask


def share_mode(directory: Path) -> None:
    """Give every file in ``directory`` the usual mode (safetensors writes its file 0600 through a temporary)."""
    mode = file_mode()
    for p in directory.iterdir():
        if p.is_file() and not p.is_symlink():
            p.chmod(mode)
        elif p.is_dir() and not p.is_symlink() and SAVED_STEP.fullmatch(p.name):
            share_mode(p)


def checkpoint_dir(out: Path, step: int) -> Path:
    """Where ``train --save-every`` puts the checkpoint of ``step`` inside the run directory ``out``."""
    return out / f"checkpoint-{step}"


def list_checkpoints(model_dir: str | Path) -> dict[int, Path]:
    """The ``checkpoint-STEP`` directories of a training run, by step."""
    root = Path(model_dir)
    found = {int(m.group(1)): p for p in root.glob("checkpoint-*") if (m := SAVED_STEP.fullmatch(p.name))
             and (p / "config.json").is_file()}  # fmt: skip
    return dict(sorted(found.items()))
