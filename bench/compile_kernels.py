"""The fused statistics kernels compiled for a GPU on a machine without one: Triton's own ptxas, for sm_90 (H100/H200),
each kind of bias (none, a table of distance, a row of keys, FIRE's MLP, cells one for every head or one a head,
CABLE's ends of each sample's own, and K3, their summary, BLOOM's row of keys of each sample's own), with
and without a softcap, sink columns (K1), a mask of one's own or each sample's (K2 with and without P). Catches what
Triton's interpreter lets through (types, constant branches, 64-bit offsets) and prints each variant's registers,
spills and shared memory: where a kind of bias costs registers the others do not, the GPU run's timings will show it.

    .venv/bin/python bench/compile_kernels.py            # every variant, about 4 minutes on 2 cores
    .venv/bin/python bench/compile_kernels.py --quick    # causal only, softcap and sinks together
    .venv/bin/python bench/compile_kernels.py --kind 6   # one kind of bias (KINDS' numbers)
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

POINTERS = {"Q": "*bf16", "K": "*bf16", "CELLS": "*u8", "CLASSES": "*i8", "BOUNDS": "*i32", "TABLE": "*fp32",
            "LSE": "*fp32", "SINK_LOGITS": "*fp32", "BQ": "*fp32", "BK": "*fp32", "REF": "*fp32", "ENDS": "*fp32",
            "CENTRED": "*fp32"}  # fmt: skip
FP64 = ("MAPS", "DIST", "COLS", "ROW_WS", "SINKS", "SCOLS", "CTX", "SDIST", "SBLOCKS", "PMAPS", "PDIST", "PFIRST",
        "PROWS", "PCOLS", "PSQ", "PSHIFT", "ROWS", "SQ", "SHIFT", "SPREAD")  # fmt: skip
KINDS = {0: "none", 1: "distance", 2: "keys", 3: "FIRE's MLP", 4: "cells", 5: "cells by head", 6: "each sample's ends",
         7: "each sample's keys"}  # fmt: skip


def signature(fn: object, constants: dict[str, object]) -> dict[str, str]:
    """Each argument's type as Triton's compiler takes it: pointers by name, the scale and cap fp32, the rest i32."""
    out = {}
    for name in fn.arg_names:  # type: ignore[attr-defined]
        if name in constants:
            out[name] = "constexpr"
        elif name in POINTERS or name in FP64:
            out[name] = POINTERS.get(name, "*fp64")
        else:
            out[name] = "fp32" if name in ("scale", "cap") else "i32"
    return out


def resources(cubin: bytes, directory: str) -> tuple[str, str]:
    """(registers, local memory bytes: spills) a thread of the compiled kernel takes, as the cubin records them
    (``cuobjdump --dump-resource-usage``, shipped with Triton)."""
    import triton

    path = os.path.join(directory, "kernel.cubin")
    with open(path, "wb") as out:
        out.write(cubin)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    text = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True).stdout
    found = {key: re.search(rf"\b{key}:(\d+)", text) for key in ("REG", "LOCAL")}
    return tuple(m.group(1) if m else "?" for m in found.values())  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="causal only, softcap and sinks together")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--kind", type=int, choices=sorted(KINDS), action="append", help="only these kinds of bias")
    args = parser.parse_args(argv)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from biasviz.summaries.kernels import triton_ends
    from biasviz.summaries.kernels import triton_kernels as kernels

    target = GPUTarget("cuda", 90, 32)
    failures, started = 0, time.time()
    print("kernel | bias | softcap | sinks | mask | P | registers | local (spill) bytes | shared bytes")
    scratch = tempfile.mkdtemp()
    for kind, softcap, sinks, mask in itertools.product(KINDS, (False, True), (False, True),
                                                        ("causal", "one", "by sample")):  # fmt: skip
        if (args.quick and (mask != "causal" or softcap != sinks)) or (args.kind and kind not in args.kind):
            continue
        masked, by_sample = mask != "causal", mask == "by sample"
        common = {"T": args.seq_len, "DP": 64, "BM": 32, "BN": 32, "HAS_BIAS": kind, "MASKED": masked,
                  "BY_SAMPLE": by_sample, "SOFTCAP": softcap, "HID": 32 if kind == 3 else 1}  # fmt: skip
        variants = [("K1", kernels.row_lse, {**common, "HAS_SINKS": sinks}, False)]
        if kind == 6 and mask == "causal" and not softcap and not sinks:  # K3: the bias's own summary, once
            variants.append(("K3", triton_ends.ends_statistics, {"N": 3, "T": args.seq_len, "BM": 32, "SUB": 32},
                             False))  # fmt: skip
        if not sinks:  # K2 reads no sinks: K1's log-sum-exp holds them
            variants += [("K2", kernels.tile_statistics, {**common, "N": 3, "SUB": 32, "POSITIONAL": p}, p)
                         for p in ((False,) if by_sample else (False, True))]  # fmt: skip
        for name, fn, constants, positional in variants:
            try:
                got = triton.compile(ASTSource(fn, signature(fn, constants), constants), target=target)
                registers, local = resources(got.asm["cubin"], scratch)
                print(f"{name} | {KINDS[kind]} | {softcap} | {sinks} | {mask} | {positional} | {registers} | {local} | "
                      f"{got.metadata.shared}")
            except Exception as err:  # a variant that does not compile is the finding
                failures += 1
                print(f"{name} | {KINDS[kind]} | {softcap} | {sinks} | {mask} | {positional} | FAILED: "
                      f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}")
    print(f"{failures} failed, {time.time() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
