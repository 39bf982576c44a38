"""How a checkpoint biasviz trained came to be, read back from its ``training.json`` for the files made from it.

A figure drawn from a model trained for 300 steps looks like noise beside a paper's figure of a model trained for
100,000; the figure should say which it is. Only what names the run is kept (preset, steps, window length,
corpus), each checked for its type: the file is data from elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from biasviz.common.inputs import read_text
from biasviz.common.jsondoc import loads
from biasviz.training.loop import TRAINING_FILE


def how_trained(directory: Path) -> dict[str, Any] | None:
    """``{"preset", "steps", "seq_len", "corpus"}`` from ``directory/training.json``; None where there is none or
    it does not say (a checkpoint biasviz did not train, a damaged file)."""
    path = Path(directory) / TRAINING_FILE
    if not path.exists():
        return None
    try:
        doc = loads(read_text(path, TRAINING_FILE), TRAINING_FILE)  # bounded: a FIFO or /dev/zero is an error
    except ValueError:
        return None
    settings = doc.get("settings") if isinstance(doc, dict) else None
    if not isinstance(settings, dict):
        return None
    out = {"preset": settings.get("preset"), "steps": doc.get("step"), "seq_len": settings.get("seq_len"),
           "corpus": doc.get("corpus_source") or settings.get("corpus")}  # fmt: skip
    if not (isinstance(out["steps"], int) and isinstance(out["seq_len"], int) and isinstance(out["preset"], str)):
        return None
    out["corpus"] = out["corpus"] if isinstance(out["corpus"], str) else ""
    return out
