"""The plot options' values checked against the file and the kind drawn, as ``biasviz plot`` and ``biasviz.plot``
both check them: one place for the rules and their messages, which name the command's options."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.common.terminal import say

if TYPE_CHECKING:
    from biasviz.store import BiasFile


def parse_sample(value: str) -> int | str:
    """``--sample``: an index from 0, or ``mean``."""
    text = value.strip().lower()
    if text == "mean":
        return "mean"
    try:
        k = int(text)
    except ValueError:
        raise UsageError(f"--sample must be a sample index (0, 1, ...) or 'mean', not '{value}'") from None
    if k < 0:
        raise UsageError(f"--sample must be 0 or more, not {k}")
    return k


def fit_to_kind(kind: str, normalize: str, log_scale: bool, log_distance: bool, sample: int | str,
                sample_given: bool, from_config: Collection[str] = ()) -> tuple[str, bool, bool, bool]:  # fmt: skip
    """(normalize, log_scale, log_distance, sample_given) with what does not apply to ``kind`` left out.

    One config file serves every kind (``configs/fire.toml`` sets ``log = true`` for its weights), so a value
    read from it (its name in ``from_config``: ``normalize``, ``log_scale``, ``log_distance``, ``sample``) that
    does not apply to this kind is dropped; given any other way (typed, or passed in Python) it is a usage error.
    """
    misfits = {
        "normalize": (kind == "weights" and normalize != "none",
                      "--normalize diagonal applies to the bias; drop it for --kind weights"),
        "log_scale": (kind == "bias" and log_scale,
                      "--log applies to attention weights; use it with --kind weights, all, std or profile"),
        "log_distance": (log_distance and kind not in ("profile", "dynamics", "positional"),
                         "--log-distance applies to a distance axis: use it with --kind profile or dynamics"),
        "sample": (kind in ("profile", "std") and sample_given and sample != "mean",
                        f"--kind {kind} is over all samples; --sample applies to --kind bias, weights or all"),
    }  # fmt: skip
    for option, (misfit, message) in misfits.items():
        if misfit and option not in from_config:
            raise UsageError(message)
    return ("none" if misfits["normalize"][0] else normalize, log_scale and not misfits["log_scale"][0],
            log_distance and not misfits["log_distance"][0], sample_given and not misfits["sample"][0])


def kinds_held(bf: BiasFile, kinds: list[str], layer: int, what: str, path: Path) -> list[str]:
    """``kinds`` less those the file cannot hold (bias-only, no bias); an error when none is left."""
    either = what != "matrix"  # profile and std draw whichever of bias and weights the file holds
    if bf.bias_only and "weights" in kinds:
        if kinds == ["weights"]:
            raise BiasvizError(f"{path} holds the bias only (extract --bias-only): no attention "
                               "weights to plot; use --kind bias")  # fmt: skip
        kinds = [k for k in kinds if k != "weights"]
    if "bias" in kinds and not bf.has_bias(layer):
        if kinds == ["bias"]:
            raise BiasvizError(f"scheme '{bf.scheme}' adds no bias, so {path} holds none; "
                               "plot its attention weights with --kind weights")  # fmt: skip
        if not either:
            say("note", f"scheme '{bf.scheme}' adds no bias; drawing the attention weights only")
        kinds = [k for k in kinds if k != "bias"]
    return kinds


def recorded_scheme(path: Path) -> str:
    """The scheme the file at ``path`` records, as ``--scheme`` would name it: an error where it cannot name output
    files (text read from a file is data, never part of a path as it stands)."""
    from biasviz.common.outputs import file_stem
    from biasviz.common.terminal import inert
    from biasviz.schemes import canonical_name
    from biasviz.store import open_bias_file

    with open_bias_file(path, isolated=True) as bf:
        stored = bf.scheme
    try:
        return canonical_name(stored)
    except BiasvizError:
        if file_stem(stored) != stored:
            raise BiasvizError(f"{path} records scheme {inert(stored)!r}, which cannot name a figure file; "
                               "pass --scheme NAME") from None  # fmt: skip
        return stored


def check_scheme(stored: str, scheme: str, path: Path) -> None:
    """An error unless the file at ``path`` holds ``scheme`` (``--scheme`` names the input and the outputs)."""
    from biasviz.schemes import canonical_name

    try:
        stored_name = canonical_name(stored)
    except BiasvizError:
        stored_name = stored
    if stored_name != scheme:
        raise BiasvizError(f"{path} holds scheme '{stored}', not '{scheme}'; "
                           f"pass --scheme {stored} or another --input")  # fmt: skip
