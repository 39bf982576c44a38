"""Where a summary's time goes on a GPU: our GPT-2-small-shape model, ``summary=True`` with and without the measures of
docs/positional.md and docs/position-measures.md, then one whole summary under torch's profiler (the ops that took the
most time).

    python bench/gpu_summary_profile.py --seq-len 4096 --samples 2 --scheme alibi   # on a GPU machine
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.summary import extract_summary
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--rows", type=int, default=25, help="profiler rows printed")
    args = parser.parse_args()
    config = BiasGPTConfig.from_preset(args.preset, args.scheme)
    torch.manual_seed(0)
    model = BiasGPTForCausalLM(config).to(args.device).eval()
    adapter = BiasGPTAdapter(model, source="bench")
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(args.samples, args.seq_len))
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        def run(**options: bool) -> float:
            sync()
            t0 = time.perf_counter()
            extract_summary(adapter, ids, Path(tmp) / "s.h5", force=True, device=args.device, progress=False,
                            **options)  # fmt: skip
            sync()
            return time.perf_counter() - t0

        run()  # warm-up: kernels compiled, memory pools grown
        variants = {"bare (no P, no section 14)": {"positional": False, "measures": False},
                    "P, no section 14": {"measures": False}, "defaults (P and section 14)": {}}
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(2):
            for name, options in variants.items():
                times[name].append(run(**options))
        print(f"T = {args.seq_len}, N = {args.samples}, {args.scheme}, {args.device}")
        for name, got in times.items():
            print(f"  {name}: min {min(got):.3f} s, all {', '.join(f'{t:.3f}' for t in got)}")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if args.device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            run()
        python = cProfile.Profile()
        python.runcall(run)
        print("\n-- Python functions by cumulative time")
        pstats.Stats(python).sort_stats("cumulative").print_stats(args.rows)
        for key in ("cpu_time_total", "self_cpu_time_total") + (("self_cuda_time_total",) if len(activities) > 1
                                                                else ()):  # fmt: skip
            print(f"\n-- sorted by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
