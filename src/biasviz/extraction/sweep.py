"""Checkpoint sweeps: how attention changes over training (``extract --checkpoints``).

A series is the checkpoint sub-folders of a folder (``checkpoint-1000``, ``global_step1000``, ``iter_0001000``,
``step_1000``, ``step1000``, ``stage1-step1000-tokens4B``: :mod:`biasviz.training.series`) or the revisions of
``ORG/NAME`` in the local Hugging Face cache (:mod:`.hub`). The chosen checkpoints are extracted on the same token
windows, each into its own file in ``OUT.partial/`` (moved into place when complete, so a checkpoint is either
finished or absent), and joined into one file whose datasets gain a leading ``checkpoint`` dimension, scaled by
the steps (:mod:`biasviz.store.combine`). Each slice is exactly the file that checkpoint alone would give.

An interrupted sweep keeps ``OUT.partial/``; ``--resume`` checks that its plan (windows, checkpoints,
settings) is this run's and extracts only the checkpoints missing. Under torchrun each process takes a
contiguous block of the checkpoints and process 0 joins them. Either way the file is the same, bit for bit.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.common.names import display_name
from biasviz.common.out_of_memory import failure_text
from biasviz.common.outputs import check_output_file
from biasviz.common.processes import World, all_true
from biasviz.extraction.resume import part_path, partial_dir, plan_of, prepare
from biasviz.training.checkpoints import list_checkpoints
from biasviz.training.compatible import check_belong_together
from biasviz.training.series import Checkpoint, folder_series, pick, step_regex


@dataclass(frozen=True)
class Series:
    """The checkpoints a sweep takes, and where they come from."""

    model: str  # what --model named
    source: str  # the folder, resolved, or ORG/NAME
    chosen: list[Checkpoint]
    left_out: dict[str, str] = field(default_factory=dict)  # checkpoints found but not usable: name -> why


def choose(spec: str, available: dict[int, Path], model_dir: str | Path) -> list[int]:
    """``all``, ``first``, ``last``, ``log:N`` or steps, comma-separated, among ``checkpoint-STEP`` folders."""
    if not available:
        raise BiasvizError(f"{model_dir} holds no checkpoint-STEP directories; train it with --save-every K")
    present = [Checkpoint(step, path.name, path) for step, path in sorted(available.items())]
    return [c.step for c in pick(spec, present, str(model_dir))]


def resolve_series(model: str | Path, spec: str, step_pattern: str | None = None) -> Series:
    """The checkpoints ``--checkpoints spec`` names in the folder or hub repository ``model``; refused when they
    do not belong to one run (another scheme, configuration or parameter shapes), before any is loaded."""
    series = _find_series(model, spec, step_pattern)
    check_belong_together([(c.name, c.path) for c in series.chosen if c.path is not None and c.path.is_dir()])
    return series


def _find_series(model: str | Path, spec: str, step_pattern: str | None = None) -> Series:
    """The checkpoints ``--checkpoints spec`` names in the folder or hub repository ``model``, as they are."""
    from biasviz.extraction.hub import hub_series, is_repo_id, missing_revision

    pattern = step_regex(step_pattern)
    text = str(model)
    if Path(text).expanduser().is_dir():
        root = Path(text).expanduser()
        return Series(text, str(root.resolve()), pick(spec, folder_series(root, pattern), str(root)))
    if is_repo_id(text):
        series = hub_series(text, pattern)
        present = [c for c in series if c.path is not None]
        why = "in the cache only in part (no config.json or weights)"
        left_out = {c.name: why for c in series if c.path is None}
        if left_out:
            import warnings

            warnings.warn(f"{text}: revisions {', '.join(left_out)} are {why} and are left out (the file records "
                          "them: checkpoints_left_out)", UserWarning, stacklevel=2)  # fmt: skip
        chosen = pick(spec, present, f"{text} (Hugging Face cache)", missing_revision(text, series))
        return Series(text, text, chosen, left_out)
    raise UsageError(f"--checkpoints needs --model DIR holding checkpoint folders, or ORG/NAME with revisions in the "
                     f"local Hugging Face cache; {text} is neither")  # fmt: skip


def extract_sweep(model_dir: str | Path, spec: str, windows: np.ndarray, out: str | Path, *,
                  scheme: str | None = None, force: bool = False, summary: bool = False, resume: bool = False,
                  step_pattern: str | None = None, series: Series | None = None, w: World | None = None,
                  model_options: dict[str, Any] | None = None, first: Any = None, **options: Any) -> Any:  # fmt: skip
    """Extract the chosen checkpoints of ``model_dir`` on ``windows`` and join them into ``out``.

    ``options`` are :func:`biasviz.extraction.run.extract`'s (or, with ``summary``, the summary's);
    ``model_options`` go to :func:`biasviz.adapters.load_model`; ``first`` is the first checkpoint's adapter
    when the caller has loaded it already. Returns the joined file's result (in process 0).
    """
    from biasviz.extraction.run import ExtractResult

    t0 = time.perf_counter()
    w = w or World()
    out = Path(out)
    check_output_file(out, force=force)  # the file appears only when the sweep is complete, resumed or not
    series = series or resolve_series(model_dir, spec, step_pattern)
    partial = partial_dir(out)
    plan = plan_of(series, windows, scheme=scheme, summary=summary, model_options=model_options, options=options)
    failure: BaseException | None = None
    if w.main:
        try:
            prepare(out, partial, plan, resume=resume, force=force)
        except BiasvizError as exc:
            failure = exc
    if not all_true(failure is None):
        raise failure or BiasvizError(f"process 0 could not prepare {partial}")
    mine = series.chosen[w.block(len(series.chosen))]
    try:
        last = _run_mine(mine, series, windows, partial, scheme=scheme, summary=summary, w=w,
                         model_options=model_options, first=first, options=options)  # fmt: skip
    except BiasvizError as exc:  # the others must hear of it before this process stops
        failure, last = exc, None
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"interrupted; {_kept(partial, series)}") from None
    except Exception as exc:  # the model's own code failed (out of memory, say): say where, in one line
        said = failure_text(exc, "extract", nothing_left=False)  # (what the sweep kept is said after it)
        failure, last = BiasvizError(f"process {w.rank} failed: {said}"), None
        failure.__cause__ = exc
    if not all_true(failure is None):
        raise BiasvizError(f"{failure or 'another process failed'}; {_kept(partial, series)}")
    if w.main:
        try:
            _join(series, partial, out, summary=summary, force=force, processes=w.size)
        except BiasvizError as exc:
            failure = exc
    if not all_true(failure is None):
        raise failure or BiasvizError(f"joining the checkpoints failed in process 0; {_kept(partial, series)}")
    if w.main:
        if last is not None and not last.layers:  # this process had no checkpoint of its own
            last = _shape_of(part_path(partial, series.chosen[0]), summary)
        shutil.rmtree(partial, ignore_errors=True)
    if last is None or not w.main:
        return last
    return ExtractResult(out, last.samples, last.seq_len, last.layers, last.has_bias, time.perf_counter() - t0,
                         out.stat().st_size)  # fmt: skip


def _run_mine(mine: list[Checkpoint], series: Series, windows: np.ndarray, partial: Path, *, scheme: str | None,
              summary: bool, w: World, model_options: dict[str, Any] | None, first: Any,
              options: dict[str, Any]) -> Any:  # fmt: skip
    """Extract this process's checkpoints that have no finished part yet; the last result (any, for its shape)."""
    from biasviz.adapters import load_model
    from biasviz.common.progress import library_bars
    from biasviz.extraction.run import ExtractResult, extract
    from biasviz.extraction.summary import extract_summary

    run = extract_summary if summary else extract
    options = {**options, "progress": options.get("progress") if w.main else False}
    last = None
    for c in mine:
        part = part_path(partial, c)
        if part.exists():  # finished by an earlier run (--resume)
            _check_finished(part, c)
            last = last or _shape_of(part, summary)
            continue
        assert c.path is not None
        reuse = first is not None and c == series.chosen[0]
        with library_bars(options["progress"]):
            adapter = first if reuse else load_model(c.path, scheme, **(model_options or {}))
        last = run(adapter, windows, part, force=False, **options)
        del adapter
    if last is None:  # no checkpoint of its own (more processes than checkpoints): describe the first part
        last = ExtractResult(partial, len(windows), int(windows.shape[1]), [], False, 0.0, 0)
    return last


def _check_finished(part: Path, c: Checkpoint) -> None:
    """A part an earlier run finished must still read as a valid file (a disk that filled, a copy cut short)."""
    from biasviz.store import open_bias_file

    try:
        open_bias_file(part).close()
    except BiasvizError as exc:
        reason = str(exc).removeprefix(f"{part} ").rstrip(".")
        raise BiasvizError(f"--resume: checkpoint {c.name}, finished by an earlier run, cannot be read from {part} "
                           f"({reason}); delete that file and run again with --resume to redo only it, or pass "
                           "--force instead of --resume to start over") from None  # fmt: skip


def _shape_of(part: Path, summary: bool) -> Any:
    """What a finished part holds (samples, length, layers, bias), as an ExtractResult."""
    import h5py

    from biasviz.extraction.run import ExtractResult
    from biasviz.store.datasets import map_name

    with h5py.File(part, "r") as f:
        layers = [int(x) for x in np.atleast_1d(f.attrs["layers"])]
        group = f[f"layer_{layers[0]}"]
        has_bias = (map_name("bias") if summary else "bias") in group
        return ExtractResult(part, int(f.attrs["samples"]), int(f.attrs["seq_len"]), layers, has_bias, 0.0,
                             part.stat().st_size)  # fmt: skip


def _join(series: Series, partial: Path, out: Path, *, summary: bool, force: bool, processes: int) -> None:
    """Every checkpoint's part, in step order, into ``out``, with what each checkpoint was."""
    import h5py

    from biasviz.store.combine import combine
    from biasviz.store.format import BIAS_DIFFERENCE
    from biasviz.store.h5io import json_attr
    from biasviz.store.summary_writer import join_summary_files

    parts = [part_path(partial, c) for c in series.chosen]
    missing = [c.name for c, p in zip(series.chosen, parts, strict=True) if not p.exists()]
    if missing:
        raise BiasvizError(f"{partial} lacks the checkpoints {', '.join(missing)}; run the command again with --resume")
    hashes, trained, gaps = [], [], []
    for p in parts:
        with h5py.File(p, "r") as f:
            hashes.append(str(f.attrs["model_sha256"]))
            trained.append(f.attrs.get("training"))
            gaps.append(f.attrs.get(BIAS_DIFFERENCE))
    steps = [c.step for c in series.chosen]
    attrs = {"source_model": display_name(series.source), "model_sha256": "per checkpoint: checkpoint_sha256",
             "checkpoint_sha256": {str(c.step): h for c, h in zip(series.chosen, hashes, strict=True)},
             "checkpoint_names": np.asarray([display_name(c.name) for c in series.chosen],
                                           dtype=h5py.string_dtype()),
             "checkpoint_tokens": np.asarray([-1 if c.tokens is None else c.tokens for c in series.chosen],
                                             dtype=np.int64),
             "processes": processes}  # fmt: skip
    runs = [json_attr(t) for t in trained]
    if all(isinstance(r, dict) for r in runs):  # how biasviz trained it, with the steps of every checkpoint in order
        attrs["training"] = {**runs[-1], "steps": [r.get("steps") for r in runs]}
    if series.left_out:
        attrs["checkpoints_left_out"] = series.left_out
    identical = _identical(series.chosen, hashes)
    if identical:
        import warnings

        groups = "; ".join(" = ".join(g) for g in identical)
        warnings.warn(f"{series.source}: checkpoints with byte-identical weights ({groups}): their rows in the sweep "
                      "are the same model (the file records them: checkpoints_identical)", UserWarning,
                      stacklevel=2)  # fmt: skip
        attrs["checkpoints_identical"] = json.dumps(identical)
    if summary:
        if all(gap is not None for gap in gaps):  # a bias declared shared, measured in each checkpoint: the largest
            attrs[BIAS_DIFFERENCE] = max(float(gap) for gap in gaps)
        join_summary_files(parts, out, steps=steps, attrs=attrs, force=force)
    else:
        combine(parts, out, along="checkpoint", steps=steps, force=force, attrs=attrs)


def _identical(chosen: list[Checkpoint], hashes: list[str]) -> list[list[str]]:
    """Names of checkpoints whose weights hash the same (sha256 of their files), in groups of two or more.

    >>> _identical([Checkpoint(s, f"step{s}", None) for s in (1, 2, 3)], ["a", "b", "a"])
    [['step1', 'step3']]
    """
    groups: dict[str, list[str]] = {}
    for c, h in zip(chosen, hashes, strict=True):
        if h:  # an unknown hash (empty) proves nothing
            groups.setdefault(h, []).append(c.name)
    return [names for names in groups.values() if len(names) > 1]


def _kept(partial: Path, series: Series) -> str:
    done = sum(part_path(partial, c).exists() for c in series.chosen)
    if not done:
        return f"no checkpoint was finished; {partial} holds the plan: --resume continues it, --force starts over"
    return (f"the {done} of {len(series.chosen)} checkpoints finished are kept in {partial}: run the same command "
            "with --resume to add the rest")  # fmt: skip


__all__ = ["Series", "choose", "extract_sweep", "list_checkpoints", "resolve_series"]
