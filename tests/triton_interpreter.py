"""Triton's interpreter at the speed of the kernels it runs, for the suite (tests/conftest.py installs it).

Triton 3.6's interpreter patches ``triton.language`` anew at every call of a ``@triton.jit`` helper inside a kernel
(``InterpretedFunction.__call__`` runs ``_patch_lang``): it walks every member of the language modules with
``inspect.getmembers`` and wraps each builtin again, though the kernel's own patch, held until its grid ends, already
wrapped them. In our kernels, whose tiles call small helpers hundreds of times a launch, that is about half the time a
test spends (3.6-4.0 s against 1.7-2.1 s for one layer's accumulators, N = 3, H = 2, T = 40), with results equal bit
for bit. Here a helper's call inside a running grid patches only the language modules (``triton.language`` or its
``core``) the grid has not patched yet, so every builtin is still wrapped as Triton wraps it; outside a grid, and
where Triton's internals are not the ones this was written against, Triton runs as it is.
"""

from __future__ import annotations

from typing import Any


def patch_helpers_once() -> bool:
    """Install the patch; whether it was installed (False: no Triton, or another version's internals)."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    internals = (interpreter, "_patch_lang"), (interpreter, "_LangPatchScope"), (executor, "__call__")
    if not all(hasattr(x, name) for x, name in internals) or getattr(interpreter, "_helpers_once", False):
        return False
    patch_lang, run_grid = interpreter._patch_lang, executor.__call__
    state: dict[str, Any] = {"grids": 0, "patched": set()}
    languages: dict[Any, frozenset[int]] = {}

    def languages_of(fn: Any) -> frozenset[int]:
        """The language modules ``fn`` reaches through its globals: those Triton's patch wraps for it."""
        if fn not in languages:
            languages[fn] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        return languages[fn]

    def patch_once(fn: Any) -> Any:
        wanted = languages_of(fn)
        if state["grids"] and wanted <= state["patched"]:
            return interpreter._LangPatchScope()  # nothing to restore: the grid's own patch holds
        state["patched"] |= wanted
        return patch_lang(fn)

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        state["grids"] += 1
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            state["grids"] -= 1
            if not state["grids"]:
                state["patched"] = set()

    interpreter._patch_lang, executor.__call__ = patch_once, run
    interpreter._helpers_once = True
    return True
