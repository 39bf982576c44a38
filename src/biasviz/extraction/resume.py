"""Where an unfinished sweep keeps its checkpoints, and the check that ``--resume`` continues the same sweep.

``OUT.partial/`` holds ``plan.json`` (what the sweep is: the checkpoints, a digest of the token windows, the
settings that shape the numbers) and one finished file per checkpoint, ``step-STEP.h5``, each moved into place
only when complete. ``--resume`` compares its own plan with the stored one, field by field, and refuses any
difference, so the joined file is the one an uninterrupted run would have written.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.atomic import write_text
from biasviz.common.errors import BiasvizError, os_error_message
from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import loads
from biasviz.training.series import Checkpoint

PLAN = "plan.json"
PLAN_VERSION = 1
_PART = re.compile(r"step-\d+\.h5|\.step-\d+\.h5\.\d+\.tmp")  # finished parts, and parts a kill -9 left half-written
# settings that change what is stored (the device, progress bars and --force do not)
_SETTINGS = ("layers", "dtype", "model_dtype", "batch_size", "resolution", "seed", "text_source", "attrs")


def partial_dir(out: Path) -> Path:
    """``data/x.h5`` -> ``data/x.h5.partial``: beside the file, on its file system."""
    return out.with_name(out.name + ".partial")


def part_path(partial: Path, c: Checkpoint) -> Path:
    return partial / f"step-{c.step}.h5"


def windows_sha256(windows: np.ndarray) -> str:
    """Digest of the token ids as int64, with their shape: the same windows give the same digest anywhere."""
    ids = np.ascontiguousarray(np.asarray(windows, dtype=np.int64))
    return hashlib.sha256(f"{ids.shape}".encode() + ids.tobytes()).hexdigest()


def plan_of(series: Any, windows: np.ndarray, *, scheme: str | None, summary: bool,
            model_options: dict[str, Any] | None, options: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """What this sweep is, as JSON-ready data (compared field by field on ``--resume``)."""
    settings = {k: options.get(k) for k in _SETTINGS}
    plan = {"plan_version": PLAN_VERSION, "model": series.source, "scheme": scheme, "summary": bool(summary),
            "checkpoints": [{"step": c.step, "name": c.name, "tokens": c.tokens} for c in series.chosen],
            "windows": {"shape": list(np.shape(windows)), "sha256": windows_sha256(windows)},
            "settings": settings, "model_options": model_options or {}}  # fmt: skip
    return json.loads(json.dumps(plan, sort_keys=True, default=str))


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            if key == "checkpoints" and isinstance(a, list) and isinstance(b, list):
                a = [c.get("name") for c in a if isinstance(c, dict)]
                b = [c.get("name") for c in b if isinstance(c, dict)]
            shown = [json.dumps(v)[:120] for v in (a, b)]
            out.append(f"{prefix}{key} was {shown[0]}, now {shown[1]}")
    return out


def prepare(out: Path, partial: Path, plan: dict[str, Any], *, resume: bool, force: bool) -> None:
    """Make ``partial`` ready: new (or, with ``force``, emptied), or with ``resume`` checked against ``plan``."""
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        raise BiasvizError(f"{partial} is in the way of the sweep's unfinished checkpoints; move it away")
    if resume:
        stored = _stored_plan(partial)
        if stored is None:
            raise BiasvizError(f"--resume: there is no unfinished sweep for {out} ({partial} does not exist); run "
                               "without --resume")  # fmt: skip
        diff = _differences(stored, plan)
        if diff:
            shown = "; ".join(diff[:3])
            raise BiasvizError(f"--resume: {partial} was started with other settings ({shown}); run the same "
                               "command as then, or pass --force instead of --resume to start over")  # fmt: skip
        return
    if partial.exists():
        if not force:
            done = len(list(partial.glob("step-*.h5")))
            raise BiasvizError(f"{partial} holds an unfinished sweep ({done} checkpoints done); add --resume to "
                               "finish it, or --force to start over")  # fmt: skip
        foreign = sorted(p.name for p in partial.iterdir() if p.name != PLAN and not _PART.fullmatch(p.name))
        if foreign:
            raise BiasvizError(f"{partial} holds files biasviz did not write ({', '.join(foreign[:5])}); move them "
                               "away to start over")  # fmt: skip
        shutil.rmtree(partial)
    try:
        partial.mkdir(parents=True)
        write_text(partial / PLAN, json.dumps(plan, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise BiasvizError(os_error_message(exc, partial)) from exc


def _stored_plan(partial: Path) -> dict[str, Any] | None:
    if not partial.is_dir():
        return None
    try:
        plan = loads(read_text(partial / PLAN, "resume plan"), str(partial / PLAN))
    except (BiasvizError, ValueError):
        raise BiasvizError(f"{partial / PLAN} is missing or damaged; pass --force instead of --resume to start "
                           "over") from None  # fmt: skip
    if not isinstance(plan, dict) or plan.get("plan_version") != PLAN_VERSION:
        raise BiasvizError(f"{partial / PLAN} is not a plan this biasviz wrote; pass --force to start over")
    return plan
