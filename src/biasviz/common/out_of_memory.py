"""Memory that ran out part-way through a command, said in one ``Error:`` line: where, how much was asked, what to
change.

The checks before a run (:mod:`.memory`) refuse what could never fit. What they let through can still run out part-way:
the model's own temporaries, another process on the same GPU, a limit the shell set. torch then raises its own error (a
paragraph on a GPU, a C++ assertion on the CPU) and numpy a ``MemoryError``; the command turns each into one line that
says which memory ran out and which options need less of it. Outputs are written to a file of their own and moved into
place at the end, so nothing the user had is lost and no partial output is left behind.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from biasviz.common.memory import size_text

CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"  # torch's words where the host refuses an allocation
_ASKED = re.compile(r"(?:[Tt]ried to allocate|[Uu]nable to allocate)\s+(\d+(?:\.\d+)?)\s*([KMGTPE]?i?B|bytes)")
GPU = "the GPU"
HOST = "this machine"

def _less(command: str | None, args: list[str]) -> str | None:
    """The options of ``biasviz COMMAND`` (run with ``args``) that need less memory; None for a command without."""
    if command == "extract":
        smaller = "a coarser --resolution" if "--summary" in args else "--summary (no T x T matrix per sample)"
        return f"{smaller}, fewer layers (--layer), a shorter --seq-len or a smaller --batch-size"
    if command == "train":
        return "a smaller --batch-size or a shorter --seq-len"
    return None


# on a GPU, the way off it
OFF_THE_GPU = {"extract": "; --device cpu runs it in host memory, --device-map spreads a large model over devices "
                          "(docs/big-models.md)",
               "train": "; --device cpu runs it in host memory"}  # fmt: skip


@dataclass(frozen=True)
class RanOut:
    """An allocation that failed: on ``where`` (the GPU or this machine), of ``asked`` (as the error said it; None
    where it did not)."""

    where: str
    asked: str | None


def ran_out(exc: BaseException | None) -> RanOut | None:
    """The failed allocation behind ``exc`` (itself, or one it was raised from or while handling); None where it is
    not one. torch is asked only where something imported it already."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        where = _where(exc)
        if where is not None:
            return RanOut(where, _asked(str(exc)))
        exc = exc.__cause__ or exc.__context__
    return None


def _where(exc: BaseException) -> str | None:
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    text = str(exc)
    if oom is not None and isinstance(exc, oom):  # the CUDA caching allocator's (ROCm's too)
        return GPU
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and CPU_ALLOCATOR in text):
        return HOST
    if isinstance(exc, RuntimeError) and re.search(r"\b(CUDA|HIP|MPS)\b.*out of memory", text, re.IGNORECASE):
        return GPU  # a driver's or another backend's words (cudaMalloc outside the caching allocator, Apple's MPS)
    return None


def _asked(text: str) -> str | None:
    """The size of the failed allocation as the error gave it, in binary units; None where it gave none."""
    found = _ASKED.search(text)
    if found is None:
        return None
    number, unit = found.groups()
    return size_text(float(number)) if unit == "bytes" else f"{number} {unit}"


def out_of_memory_message(found: RanOut, command: str | None, args: list[str] | None = None, *,
                          nothing_left: bool = True) -> str:  # fmt: skip
    """The one line for ``found`` in ``biasviz COMMAND ARGS``: what ran out, and the options that need less memory;
    ``nothing_left``: it ends saying that no partial output was left behind (a sweep says instead what it kept)."""
    what = f"'biasviz {command}'" if command else "the command"
    asked = f" (an allocation of {found.asked} failed)" if found.asked else ""
    less = _less(command, args or [])
    fix = f"try {less}" if less else "free memory (other programs, other processes on the GPU) or use a larger machine"
    if found.where == GPU and less:
        fix += OFF_THE_GPU.get(command or "", "")
    said = f"{found.where} ran out of memory part-way through {what}{asked}; {fix}"
    return f"{said}. No partial output was left behind." if nothing_left else said


def failure_text(exc: BaseException, command: str, *, nothing_left: bool = True) -> str:
    """What a process of ``biasviz COMMAND`` says of an error raised by the model's own code: the line for memory that
    ran out (:func:`out_of_memory_message`), else the error's type and text."""
    found = ran_out(exc)
    if found is not None:
        return out_of_memory_message(found, command, nothing_left=nothing_left)
    return f"{type(exc).__name__}: {exc}"


__all__ = ["RanOut", "failure_text", "out_of_memory_message", "ran_out"]
