"""A summary's time and peak memory, and our forward's, by two versions of biasviz, interleaved (BENCHMARKS.md §13 and
§14, before and after).

Each run is :mod:`bench.position_measures`'s child (GPT-2-small shape, random weights: the bare forward through the
last layer, or the summary of the last layer with the defaults, with or without docs/position-measures.md's measures)
in a fresh process whose ``PYTHONPATH`` is one tree's ``src``: before, after, before, after, ... so that a slow spell
of the machine touches both alike.

    .venv/bin/python bench/summary_trees.py --before /path/to/old/checkout --after . --seq-len 4096 --samples 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

MODES = ("forward", "summary without 14", "summary with 14")  # bench.position_measures' child modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--scheme", default="rope")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args()
    here = Path(__file__).parents[1]
    print(f"load before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores; python {platform.python_version()}")
    print(f"{args.preset}, scheme {args.scheme}, T = {args.seq_len}, N = {args.samples}, summary of the last layer\n")
    got: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for mode in args.modes:
            for label, tree in (("before", args.before), ("after", args.after)):
                cmd = [sys.executable, "-m", "bench.position_measures", "--mode", mode, "--child-samples",
                       str(args.samples), "--seq-len", str(args.seq_len), "--preset", args.preset, "--scheme",
                       args.scheme]  # fmt: skip
                env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{tree.resolve() / 'src'}"}
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=here, env=env)
                got.setdefault((mode, label), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| mode | version | s, median [min-max] | x before | peak RSS GiB, max |")
    print("| --- | --- | --- | --- | --- |")
    for mode in args.modes:
        base = statistics.median(r["seconds"] for r in got[mode, "before"])
        for label in ("before", "after"):
            seconds = [r["seconds"] for r in got[mode, label]]
            med = statistics.median(seconds)
            print(f"| {mode} | {label} | {med:.2f} [{min(seconds):.2f}-{max(seconds):.2f}] | {med / base:.3f} | "
                  f"{max(r['peak_rss'] for r in got[mode, label]) / 1024**3:.2f} |")
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
