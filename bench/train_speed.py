"""Training speed of the `tiny` preset: seconds for N steps of every scheme (run by hand, not in CI).

    .venv/bin/python bench/train_speed.py [--steps 300] [--schemes alibi,cable]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from transformers.utils import logging as hf_logging

from biasviz.schemes import SCHEMES
from biasviz.train import TrainSettings, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    print(f"{'scheme':<14}{'steps':>6}{'train s':>9}{'total s':>9}{'tokens/s':>10}{'loss':>14}")
    for name in args.schemes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            r = train(TrainSettings(scheme=name, steps=args.steps, device=args.device), f"{tmp}/ckpt", progress=False)
            total = time.perf_counter() - start
        loss = f"{r.losses[0]:.2f}->{sum(r.losses[-10:]) / len(r.losses[-10:]):.2f}"
        print(f"{name:<14}{args.steps:>6}{r.seconds:>9.1f}{total:>9.1f}{r.tokens / r.seconds:>10,.0f}{loss:>14}")


if __name__ == "__main__":
    main()
