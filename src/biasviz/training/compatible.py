"""Whether checkpoints belong to one series: same scheme, same configuration, same parameter shapes.

A sweep draws how one model's bias changes over training; a checkpoint of another run (another scheme,
width or vocabulary) would put a different model's numbers on the same axes. Checked from what the files
say (``config.json`` and the tensor shapes in the safetensors headers; nothing is loaded), before any work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import JSONTooLarge, loads
from biasviz.common.names import utf8_path

#: Configuration keys that say how a checkpoint was saved, not what model it is.
VOLATILE_KEYS = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash",
                           "architectures", "use_cache"})  # fmt: skip


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        doc = loads(read_text(path, "config.json"), str(path))
    except JSONTooLarge:
        raise
    except (OSError, ValueError) as exc:
        raise BiasvizError(f"{path} cannot be read as JSON ({exc}); the checkpoint is damaged") from None
    return {k: v for k, v in doc.items() if k not in VOLATILE_KEYS} if isinstance(doc, dict) else {}


def _shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, from the safetensors headers alone (other formats: none known, not compared)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(utf8_path(file), framework="numpy") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    shapes[key] = tuple(f.get_slice(key).get_shape())
        except Exception as exc:  # noqa: BLE001 - a damaged header is the checkpoint's problem, said by name
            raise BiasvizError(f"{file} is not a readable safetensors file ({type(exc).__name__}); the checkpoint "
                               "is damaged") from None  # fmt: skip
    return shapes


def _difference(a: dict[str, Any], b: dict[str, Any], what: str) -> str | None:
    keys = sorted(set(a) | set(b), key=str)
    for key in keys:
        if a.get(key) != b.get(key):
            return f"{what} {key!s}: {a.get(key, 'absent')!s:.60} against {b.get(key, 'absent')!s:.60}"
    return None


def check_belong_together(checkpoints: Sequence[tuple[str, Path]]) -> None:
    """Refuse a series whose checkpoints (name, folder) differ in configuration or parameter shapes, naming the
    first odd one and what differs."""
    if len(checkpoints) < 2:
        return
    first_name, first = checkpoints[0]
    config, shapes = _config(first), _shapes(first)
    for name, folder in checkpoints[1:]:
        other = _difference(config, _config(folder), "config") or _difference(shapes, _shapes(folder), "tensor")
        if other is not None:
            raise BiasvizError(f"checkpoint {name} does not belong with {first_name}: {other}; a sweep takes the "
                               "checkpoints of one training run")  # fmt: skip


__all__ = ["VOLATILE_KEYS", "check_belong_together"]
