"""What tracing costs on an eager and a fused model: GPT-2-small (transformers) loaded with
``attn_implementation="eager"`` (q.kᵀ, softmax written out: followed op by op) and ``"sdpa"`` (fused calls,
formed again), one sample of T tokens.

Rows, each the median of ``--runs`` timed passes after one warm-up, taken in turn (bare, one layer, all,
bare, ...) so that a load that comes and goes hits them alike, under ``torch.inference_mode``:

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

Times = dict[str, list[tuple[float, float]]]


def timed(rows: dict[str, Callable[[], object]], runs: int, device: torch.device) -> Times:
    """Each row timed ``runs`` times, the rows taken in turn (a load that comes and goes hits them alike):
    (wall seconds, CPU seconds of this process); on a shared machine the CPU time is the steadier."""

    def once(fn: Callable[[], object]) -> tuple[float, float]:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0

    for fn in rows.values():
        once(fn)  # warm-up
    times: Times = {label: [] for label in rows}
    for _ in range(runs):
        for label, fn in rows.items():
            times[label].append(once(fn))
    return times


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
    print(f"{'':26}{'wall s':>10}{'x bare':>10}{'CPU s':>10}{'x bare':>10}")
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

        with torch.inference_mode():
            times = timed({"bare forward": lambda model=model: model(ids), "trace, layer 11": trace([11]),
                           "trace, all 12": trace(None)}, args.runs, device)  # fmt: skip
        wall0 = statistics.median(w for w, _ in times["bare forward"])
        cpu0 = statistics.median(c for _, c in times["bare forward"])
        for label, pairs in times.items():
            wall, cpu = statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs)
            print(f"{impl:8}{label:18}{wall:10.3f}{wall / wall0:10.2f}{cpu:10.3f}{cpu / cpu0:10.2f}")
        del model


if __name__ == "__main__":
    main()
