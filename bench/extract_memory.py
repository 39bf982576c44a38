"""Peak memory of ``extract`` at long lengths on the CPU: is it the model plus one batch, whatever --samples?

Each measurement runs in a fresh process (peak RSS is a per-process high-water mark). The model is
a randomly initialised GPT-2-small-sized variant (12 layers, 12 heads) and the inputs are random
token ids, so nothing is downloaded. Usage::

    .venv/bin/python bench/extract_memory.py                      # T=4096, samples 1 and 3
    .venv/bin/python bench/extract_memory.py --seq-len 2048 --samples 1 2 4 --preset tiny
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB = 1024 * 1024


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def current_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def child(args: argparse.Namespace) -> None:
    """One measurement: build the model, extract, report as JSON on stdout."""
    import numpy as np
    import torch

    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.run import extract
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    torch.manual_seed(0)
    config = BiasGPTConfig.from_preset(args.preset, args.scheme)
    model = BiasGPTForCausalLM(config).eval()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(args.samples[0], args.seq_len))
    baseline = current_rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = extract(BiasGPTAdapter(model, source="random"), ids, Path(tmp) / "x.h5", layers=-1,
                         batch_size=args.batch_size, device="cpu", progress=False)  # fmt: skip
        seconds = time.perf_counter() - t0
    h, t, b = config.n_head, args.seq_len, args.batch_size
    print(json.dumps({
        "samples": args.samples[0], "peak_rss": peak_rss_bytes(), "rss_before_extract": baseline,
        "model_bytes": model_bytes, "batch_bytes": (b * h * t * t + h * t * t) * 4,  # weights (b, ...) + bias (1, ...)
        "seconds": seconds, "file_bytes": result.bytes, "threads": torch.get_num_threads(),
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--preset", default="gpt2-small", choices=["tiny", "gpt2-small"])
    parser.add_argument("--scheme", default="alibi")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(f"extract on CPU: preset {args.preset}, scheme {args.scheme}, T={args.seq_len}, batch {args.batch_size}, "
          "final layer only")  # fmt: skip
    rows = []
    for n in args.samples:
        cmd = [sys.executable, __file__, "--child", "--seq-len", str(args.seq_len), "--samples", str(n),
               "--batch-size", str(args.batch_size), "--preset", args.preset, "--scheme", args.scheme]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"measurement with {n} samples failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first = rows[0]
    print(f"model parameters:            {first['model_bytes'] / MB:8.0f} MiB")
    print(f"one batch of captured bias + weights: {first['batch_bytes'] / MB:8.0f} MiB")
    print(f"{'samples':>8} {'peak RSS MiB':>13} {'RSS before MiB':>15} {'seconds':>8} {'file MiB':>9}")
    for r in rows:
        print(f"{r['samples']:>8} {r['peak_rss'] / MB:>13.0f} {r['rss_before_extract'] / MB:>15.0f} "
              f"{r['seconds']:>8.1f} {r['file_bytes'] / MB:>9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
