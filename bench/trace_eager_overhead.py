"""What tracing costs on an eager and a fused model: GPT-2-small (transformers) loaded with
``attn_implementation="eager"`` (q.kᵀ, softmax written out: followed op by op) and ``"sdpa"`` (fused calls,
formed again), one sample of T tokens.

Rows, each the median of ``--runs`` timed passes after one warm-up, under ``torch.inference_mode``:

  bare forward        ``model(ids)``, no trace
  trace, layer 11     ``biasviz.trace(model, layers=[11])``: every call counted, call 11 formed; the forward
                      runs to the end (the overhead of tracing one layer, not the saving of ``stop``)
  trace, all 12       ``biasviz.trace(model)``: every call formed and kept (12 x 12 x T x T float32)

Random weights (nothing is downloaded).

    .venv/bin/python bench/trace_eager_overhead.py [--seq-len 1024] [--runs 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    import biasviz

    device = torch.device(args.device)
    ids = torch.randint(0, 50257, (1, args.seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"GPT-2-small, T = {args.seq_len}, 1 sample, {name}, torch {torch.__version__}; median of {args.runs}")
    print(f"{'':8}{'':18}{'seconds':>10}{'x bare':>10}")
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        config = GPT2Config(n_positions=args.seq_len)
        model = GPT2LMHeadModel._from_config(config, attn_implementation=impl).to(device).eval()

        def trace(layers: list[int] | None, model: torch.nn.Module = model) -> Callable[[], object]:
            def run() -> object:
                with biasviz.trace(model, layers=layers) as t:
                    model(ids)
                assert len(t.weights) == (12 if layers is None else 1)
                return t.weights

            return run

        rows: dict[str, float] = {}
        with torch.inference_mode():
            rows["bare forward"] = timed(lambda model=model: model(ids), args.runs, device)
            rows["trace, layer 11"] = timed(trace([11]), args.runs, device)
            rows["trace, all 12"] = timed(trace(None), args.runs, device)
        for label, seconds in rows.items():
            print(f"{impl:8}{label:18}{seconds:10.3f}{seconds / rows['bare forward']:10.2f}")
        del model


if __name__ == "__main__":
    main()
