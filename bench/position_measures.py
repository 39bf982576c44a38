"""What docs/position-measures.md's measures cost a summary (BENCHMARKS.md §14): GPT-2-small shape with the ``rope``
scheme, the summary of the last layer with every section 14 measure and SE against the same summary without them, and
the bare forward of the model through that layer, and the fused floor of the same shape (transformers' GPT2Model with
SDPA's causal kernel, no LM head: N forwards of T tokens), each in a fresh process, interleaved (forward, without, with,
floor, forward, ...), with each one's peak RSS. Nothing is downloaded: the models are randomly initialised.

    .venv/bin/python bench/position_measures.py --seq-len 4096 --samples 8 --repeats 3
    .venv/bin/python bench/position_measures.py --seq-len 4096 --samples 2 16 --repeats 1   # RSS against N
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("forward", "summary without 14", "summary with 14", "fused floor")


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from bench.common import peak_rss_bytes
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.summary import extract_summary
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    torch.manual_seed(0)
    config = BiasGPTConfig.from_preset(args.preset, args.scheme, n_positions=max(1024, args.seq_len))
    model = BiasGPTForCausalLM(config).eval()
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(args.child_samples, args.seq_len))
    adapter = BiasGPTAdapter(model, source="random")
    layer = adapter.resolve_layers(-1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "fused floor":
            floor = _floor(config, args.seq_len)
        t0 = time.perf_counter()
        if args.mode == "fused floor":
            with torch.inference_mode():
                for s in range(len(ids)):
                    floor(input_ids=torch.from_numpy(ids[s : s + 1]))
        elif args.mode == "forward":
            with adapter.stopping_after(layer), torch.inference_mode():
                for s in range(len(ids)):
                    adapter.forward(torch.from_numpy(ids[s : s + 1]))
        else:
            extract_summary(adapter, ids, Path(tmp) / "s.h5", layers=-1, device="cpu", progress=False,
                            measures=args.mode == "summary with 14")  # fmt: skip
        seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak_rss": peak_rss_bytes()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--scheme", default="rope")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--samples", type=int, nargs="+", default=[8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--child-samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        child(args)
        return
    import torch

    print(f"CPU: {_cpu_model()}; torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{os.cpu_count()} cores; load before: {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{args.preset}, scheme {args.scheme}, T = {args.seq_len}, summary of the last layer (defaults)\n")
    print("| N | mode | s, median [min] | x without 14 | x forward | x fused floor | peak RSS GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in args.samples:
        got: dict[str, list[dict]] = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for mode in MODES:  # interleaved: a slow spell of the machine touches every mode alike
                cmd = [sys.executable, "-m", "bench.position_measures", "--mode", mode, "--child-samples", str(n),
                       "--seq-len", str(args.seq_len), "--preset", args.preset, "--scheme", args.scheme]  # fmt: skip
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
                got[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
        med = {m: statistics.median(r["seconds"] for r in rows) for m, rows in got.items()}
        for mode, rows in got.items():
            seconds = [r["seconds"] for r in rows]
            print(f"| {n} | {mode} | {med[mode]:.2f} [{min(seconds):.2f}] | {med[mode] / med[MODES[1]]:.2f} | "
                  f"{med[mode] / med[MODES[0]]:.2f} | {med[mode] / med[MODES[3]]:.2f} | "
                  f"{max(r['peak_rss'] for r in rows) / 1024**3:.2f} |")
    print(f"\nload after: {os.getloadavg()[0]:.2f}; python {platform.python_version()}")


def _floor(config, seq_len: int):  # -> transformers GPT2Model: our config's shape, SDPA's causal kernel
    from transformers import GPT2Config, GPT2Model

    shape = GPT2Config(n_positions=seq_len, n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                       vocab_size=config.vocab_size, attn_implementation="sdpa")  # fmt: skip
    return GPT2Model(shape).eval()


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
