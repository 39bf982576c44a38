"""What tracing fused attention costs: GPT-2-small (transformers, SDPA attention) at T = 2048 on one sample.

Rows, each the median of ``--runs`` timed passes after one warm-up, under ``torch.inference_mode``:

  bare forward     ``model(ids)``: the whole GPT2LMHeadModel with fused SDPA attention (logits included)
  bare body        ``model.transformer(ids)``: the 12 blocks without the language-model head
  trace, layer 11  ``biasviz.trace(model, layers=[11], stop=True)``: calls 0-10 run fused and are only
                   counted; call 11's bias and weights are formed in float32, and the forward stops there
  trace, all 12    ``biasviz.trace(model)``: every call formed (12 x 12 x T x T float32 kept in memory)
  extract          ``biasviz.extract(model, ids, out, layers=-1)``: the final layer to HDF5, probe pass included

Random weights (nothing is downloaded); the goal is trace(layer 11) within 1.3x the bare forward.

    .venv/bin/python bench/trace_overhead.py [--seq-len 2048] [--runs 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timed(fn: Callable[[], object], runs: int, device: torch.device) -> float:
    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once()  # warm-up
    return statistics.median(once() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    import biasviz

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = GPT2Config(n_positions=args.seq_len)  # GPT-2-small: 12 layers, 12 heads, width 768
    model = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa").to(device).eval()
    ids = torch.randint(0, config.vocab_size, (1, args.seq_len), device=device)

    def trace(layers: list[int] | None) -> Callable[[], object]:
        def run() -> object:
            with biasviz.trace(model, layers=layers, stop=layers is not None) as t:
                model(ids)
            return t.weights

        return run

    rows: dict[str, float] = {}
    with torch.inference_mode():
        rows["bare forward"] = timed(lambda: model(ids), args.runs, device)
        rows["bare body"] = timed(lambda: model.transformer(ids), args.runs, device)
        rows["trace, layer 11"] = timed(trace([11]), args.runs, device)
        rows["trace, all 12"] = timed(trace(None), args.runs, device)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gpt2.h5"

        def extract() -> object:
            return biasviz.extract(model, ids, out, layers=-1, device=device, force=True, progress=False)

        rows["extract"] = timed(extract, args.runs, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"GPT-2-small (SDPA), T = {args.seq_len}, 1 sample, {name}, torch {torch.__version__}; median of {args.runs}")
    print(f"{'':18}{'seconds':>10}{'x bare forward':>16}")
    for label, seconds in rows.items():
        print(f"{label:18}{seconds:10.3f}{seconds / rows['bare forward']:16.2f}")


if __name__ == "__main__":
    main()
