"""Checkpoint series: which folder or revision names carry a training step, and which checkpoints a sweep takes.

One table (:data:`STEP_PATTERNS`) says how a name gives its step (and, where it carries them, the tokens seen);
``--step-pattern REGEX`` adds another. ``--checkpoints`` picks from the steps present (:func:`pick`):

- ``all``; ``first``, ``last``; explicit steps (``1000``) or names (``step1000``), comma-separated;
- ``log:N``: N checkpoints log-spaced over the steps present, defined in :func:`log_spaced`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from biasviz.common.errors import BiasvizError, UsageError

#: (regex matched against the whole name, example, who writes such names), asked in this order
STEP_PATTERNS: tuple[tuple[str, str, str], ...] = (
    (r"checkpoint-(?P<step>\d+)", "checkpoint-1000", "`biasviz train --save-every`, transformers `Trainer`"),
    (r"global_step(?P<step>\d+)", "global_step1000", "DeepSpeed, Megatron-DeepSpeed (BLOOM's intermediate "
     "checkpoints)"),
    (r"iter_(?P<step>\d+)", "iter_0001000", "Megatron-LM"),
    (r"step_(?P<step>\d+)", "step_1000", "many training scripts"),
    (r"(?:stage\d+-)?step(?P<step>\d+)-tokens(?P<tokens>\d+[KMBT]?)", "stage1-step1000-tokens4B",
     "OLMo revisions (4B = 4·10⁹ tokens; K, M, B, T)"),
    (r"step(?P<step>\d+)", "step1000", "Pythia revisions"),
)  # fmt: skip
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a series: its step, its folder or revision name, where it lies, tokens seen if known."""

    step: int
    name: str
    path: Path | None  # None: named (a hub revision's ref) but not on disk
    tokens: int | None = None


def step_regex(pattern: str | None) -> re.Pattern[str] | None:
    """``--step-pattern``: a regex with a named group ``step`` (and optionally ``tokens``), or None."""
    if pattern is None:
        return None
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--step-pattern '{pattern}' is not a regular expression: {exc}") from None
    if "step" not in regex.groupindex:
        raise UsageError(f"--step-pattern '{pattern}' has no named group 'step'; write it as (?P<step>\\d+)")
    return regex


def parse_tokens(text: str) -> int:
    """``4B`` -> 4 000 000 000; plain digits are a count of tokens."""
    m = re.fullmatch(r"(\d+)([KMBT]?)", text.strip())
    if not m:
        raise BiasvizError(f"cannot read a token count from '{text}' (digits, optionally followed by K, M, B or T)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_name(name: str, pattern: re.Pattern[str] | None = None) -> tuple[int, int | None] | None:
    """(step, tokens or None) from a folder or revision name, or None when no pattern fits the whole name.

    ``pattern`` (``--step-pattern``), when given, is the only one asked.
    """
    for regex in [pattern] if pattern is not None else [re.compile(p) for p, _, _ in STEP_PATTERNS]:
        m = regex.fullmatch(name)
        if m and m.group("step") is not None and m.group("step").isdigit():
            tokens = m.groupdict().get("tokens")
            return int(m.group("step")), None if tokens is None else parse_tokens(tokens)
    return None


def ordered(found: Sequence[Checkpoint], where: str) -> list[Checkpoint]:
    """By step; two names for one step are refused (a sweep's checkpoint axis is its steps)."""
    by_step: dict[int, Checkpoint] = {}
    for c in found:
        if c.step in by_step:
            raise BiasvizError(f"{where}: '{by_step[c.step].name}' and '{c.name}' are both step {c.step}; keep one, "
                               "or pass --step-pattern to match only one naming")  # fmt: skip
        by_step[c.step] = c
    return [by_step[s] for s in sorted(by_step)]


def folder_series(root: str | Path, pattern: re.Pattern[str] | None = None) -> list[Checkpoint]:
    """The sub-folders of ``root`` whose names give a step and that hold a ``config.json``, by step."""
    base = Path(root)
    found = []
    for p in sorted(base.iterdir()) if base.is_dir() else []:
        parsed = parse_name(p.name, pattern)
        if parsed is not None and p.is_dir() and (p / "config.json").is_file():
            found.append(Checkpoint(parsed[0], p.name, p, parsed[1]))
    return ordered(found, str(base))


def log_spaced(steps: Sequence[int], n: int) -> list[int]:
    """``log:N``: N of ``steps`` (sorted, distinct) spread evenly in log(step), first and last always included.

    When the first step is 0 it is taken and counts as one of the N; the other N - 1 (all N otherwise) are
    the targets t_k = lo * (last / lo)^(k / (M - 1)), k = 0 .. M - 1, from lo, the smallest nonzero step, to
    the last. Each target takes the present step nearest to it in log(step) that is not taken yet (ties: the
    smaller step), the two end targets (lo and the last, both present) first, then the others in order. So
    the result has exactly min(N, len(steps)) distinct steps, sorted.
    """
    if n < 1:
        raise UsageError(f"--checkpoints log:{n}: N must be at least 1")
    present = sorted(set(steps))
    if n >= len(present):
        return present
    if n == 1:
        return [present[-1]]
    chosen = [present[0]] if present[0] == 0 else []
    nonzero = [s for s in present if s > 0]
    m = n - len(chosen)
    lo, hi = nonzero[0], nonzero[-1]
    targets = [lo * (hi / lo) ** (k / (m - 1)) for k in range(m)] if m > 1 else [hi]
    order = [0, len(targets) - 1, *range(1, len(targets) - 1)] if m > 1 else [0]
    for k in order:
        t = math.log(targets[k])
        free = [s for s in nonzero if s not in chosen]
        chosen.append(min(free, key=lambda s: (abs(math.log(s) - t), s)))
    return sorted(chosen)


def _short(steps: Sequence[int]) -> str:
    text = [str(s) for s in steps]
    return ", ".join(text if len(text) <= 12 else [*text[:5], "...", *text[-5:]])


def pick(spec: str, present: Sequence[Checkpoint], where: str,
         missing: Callable[[str], BiasvizError] | None = None) -> list[Checkpoint]:  # fmt: skip
    """The checkpoints ``--checkpoints`` names among ``present`` (sorted by step, distinct), by step.

    Items: ``all``, ``first``, ``last``, ``log:N``, a step or a name. ``missing(item)`` gives the error for an
    item that names no checkpoint on disk (a hub revision not fetched); else it is a usage error.
    """
    explicit = [x.strip() for x in spec.split(",") if x.strip() and x.strip().lower() not in ("all", "first", "last")
                and not x.strip().lower().startswith("log:")]  # fmt: skip
    if not present and missing is not None and explicit:
        raise missing(explicit[0])
    if not present:
        examples = ", ".join(example for _, example, _ in STEP_PATTERNS)
        raise BiasvizError(f"{where} holds no checkpoints whose names give a step ({examples}); pass "
                           "--step-pattern for other names")  # fmt: skip
    by_step = {c.step: c for c in present}
    by_name = {c.name: c for c in present}
    steps = sorted(by_step)
    chosen: set[int] = set()
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        low = item.lower()
        if low == "all":
            chosen.update(steps)
        elif low in ("first", "last"):
            chosen.add(steps[0] if low == "first" else steps[-1])
        elif low.startswith("log:"):
            count = low[4:]
            if not count.isdigit():
                raise UsageError(f"--checkpoints: '{item}' should be log:N with N a whole number, such as log:10")
            chosen.update(log_spaced(steps, int(count)))
        elif item.isdigit() and int(item) in by_step:
            chosen.add(int(item))
        elif item in by_name:
            chosen.add(by_name[item].step)
        elif missing is not None:
            raise missing(item)
        else:
            raise UsageError(f"--checkpoints: '{item}' is not all, first, last or one of the steps {_short(steps)} "
                             f"(nor log:N) of {where}")  # fmt: skip
    if not chosen:
        raise UsageError("--checkpoints is empty; use all, first,last, log:N or a list of steps")
    return [by_step[s] for s in sorted(chosen)]


def pattern_table() -> str:
    """The table of names, as Markdown (README, "Training dynamics")."""
    rows = [f"| `{example}` | `{regex}` | {who} |" for regex, example, who in STEP_PATTERNS]
    return "\n".join(["| name | pattern | written by |", "| --- | --- | --- |", *rows])
