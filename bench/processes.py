"""One process against torchrun with N: `biasviz extract` and `biasviz train`, whole commands, wall time.

  extract  a GPT-2-small-shaped ALiBi model (random weights, saved with save_pretrained), --samples S
           x --seq-len T, final layer, bias and weights to HDF5 (for N > 1: shards joined by chunk copy)
  train    the tiny preset, --steps 40 x batch 8 x T = 128 per process (N processes see N times the tokens)

Each row is the median of ``--runs`` runs of the whole command (start-up, model loading and writing
included). torchrun gives each process OMP_NUM_THREADS=1 by default; the one-process run uses every core.

    .venv/bin/python bench/processes.py [--procs 1 2] [--samples 8] [--seq-len 512] [--runs 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt_range  # noqa: E402

PYTHON = sys.executable


def command(procs: int, args: list[str]) -> list[str]:
    if procs == 1:
        return [PYTHON, "-m", "biasviz", *args]
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", "-m", "biasviz", *args]


def timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: one GPU per process under torchrun")
    args = parser.parse_args()

    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        BiasGPTForCausalLM(BiasGPTConfig.from_preset("gpt2-small", "alibi")).save_pretrained(root / "model")
        (root / "text.txt").write_text(Path(argparse.__file__).read_text() * 4)
        extract = ["extract", "--model", "model", "--samples", str(args.samples), "--seq-len", str(args.seq_len),
                   "--text", "text.txt", "--out", "out.h5", "--force", "--quiet", "--device", args.device]  # fmt: skip
        train = ["train", "--scheme", "alibi", "--steps", "40", "--seq-len", "128", "--batch-size", "8",
                 "--corpus", "text.txt", "--out", "run", "--force", "--quiet", "--device", args.device]  # fmt: skip
        print(f"CPU, {os.cpu_count()} cores; median [min-max] of {args.runs} runs, seconds")
        label = f"extract {args.samples} x {args.seq_len}"
        print(f"{'processes':>10}  {label:>22}  {'train 40 steps':>22}")
        for n in args.procs:
            ext = [timed(command(n, extract), root) for _ in range(args.runs)]
            trn = [timed(command(n, train), root) for _ in range(args.runs)]
            print(f"{n:>10}  {fmt_range(ext):>22}  {fmt_range(trn):>22}  (train: {40 * 8 * 128 * n:,} tokens)")


if __name__ == "__main__":
    main()
