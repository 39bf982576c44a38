"""Training speed: seconds and tokens/s for N steps of every scheme (run by hand, not in CI).

    .venv/bin/python bench/train_speed.py [--steps 300] [--schemes alibi,cable]
    python bench/train_speed.py --device cuda --preset gpt2-small --seq-len 1024 --batch-size 16 \\
        --steps 60 --schemes alibi --compile both

``steady tok/s`` is the throughput of the second half of the steps (warm-up and compilation excluded).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator

import torch
from transformers.utils import logging as hf_logging

from biasviz.model import blocked_grad, fused
from biasviz.schemes import SCHEMES
from biasviz.training.loop import TrainSettings, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--compile", default="no", choices=["no", "yes", "both"])
    parser.add_argument("--routes", default="chosen", choices=["chosen", "both"],
                        help="both: each scheme also with the CPU's blocked recomputation forced, interleaved (the "
                             "route training takes where a step's cells do not fit in one block)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"torch {torch.__version__}, {name}; preset {args.preset}, batch {args.batch_size} x {args.seq_len}, "
          f"precision {args.precision}")  # fmt: skip
    print(f"{'scheme':<14}{'compile':>8}{'steps':>6}{'train s':>9}{'total s':>9}{'tok/s':>11}{'steady tok/s':>14}"
          f"{'loss':>14}")  # fmt: skip
    compiles = {"no": [False], "yes": [True], "both": [False, True]}[args.compile]
    routes = ["chosen", "recomputed"] if args.routes == "both" else ["chosen"]
    runs = [(s, c, r) for _ in range(args.repeats) for s in args.schemes.split(",") for c in compiles for r in routes]
    for scheme, compiled, route in runs:
        with _route(route):
            settings = TrainSettings(scheme=scheme, preset=args.preset, steps=args.steps, seq_len=args.seq_len,
                                     batch_size=args.batch_size, device=args.device, precision=args.precision,
                                     compile=compiled)  # fmt: skip
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                r = train(settings, f"{tmp}/ckpt", progress=False)
                total = time.perf_counter() - start
            loss = f"{r.losses[0]:.2f}->{sum(r.losses[-10:]) / len(r.losses[-10:]):.2f}"
            taken = ",".join(fused.routes_taken())  # the routes this run's attention calls took
            print(f"{scheme:<14}{'yes' if compiled else 'no':>8}{args.steps:>6}{r.seconds:>9.1f}{total:>9.1f}"
                  f"{r.tokens / r.seconds:>11,.0f}{r.steady_tokens_per_s:>14,.0f}{loss:>14}  {taken}",
                  flush=True)  # fmt: skip


@contextlib.contextmanager
def _route(route: str) -> Iterator[None]:
    """``recomputed``: the blocked recomputation even where a step's cells fit in one block."""
    if route == "chosen":
        yield
        return
    kept = blocked_grad.one_block
    blocked_grad.one_block = lambda q: False
    try:
        yield
    finally:
        blocked_grad.one_block = kept


if __name__ == "__main__":
    main()
