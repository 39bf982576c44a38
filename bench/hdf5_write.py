"""HDF5 write throughput and file size per sample, by storage dtype and compression filter.

The tensors are real: the final layer's bias and weights of a randomly initialised GPT-2-small-shaped
ALiBi model, captured once, then written ``--samples`` times per setting through ``BiasFileWriter``
(the masking, checks, conversion and filters that ``extract`` pays). Usage::

    .venv/bin/python bench/hdf5_write.py                 # T=2048, 5 runs per setting
    .venv/bin/python bench/hdf5_write.py --seq-len 4096 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MIB, fmt_range  # noqa: E402

# (label, BiasFileWriter filter keywords); "none" is only a reference: format 1 files are compressed
SETTINGS: list[tuple[str, dict]] = [
    ("gzip 1 + shuffle, 1 thread", {"compression": "gzip", "compression_opts": 1, "shuffle": True, "workers": 1}),
    ("gzip 1 + shuffle", {"compression": "gzip", "compression_opts": 1, "shuffle": True}),
    ("gzip 1", {"compression": "gzip", "compression_opts": 1, "shuffle": False}),
    ("gzip 4 + shuffle", {"compression": "gzip", "compression_opts": 4, "shuffle": True}),
    ("gzip 6 + shuffle", {"compression": "gzip", "compression_opts": 6, "shuffle": True}),
    ("lzf + shuffle", {"compression": "lzf", "compression_opts": None, "shuffle": True}),
    ("lzf", {"compression": "lzf", "compression_opts": None, "shuffle": False}),
    ("none (reference)", {"compression": None, "compression_opts": None, "shuffle": False}),
]


def capture(seq_len: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """input ids (1, T), weights (1, H, T, T) and bias (1, H, T, T) of the final layer."""
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.full_matrices import full_matrices
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    torch.manual_seed(0)
    config = BiasGPTConfig.from_preset("gpt2-small", "alibi")
    adapter = BiasGPTAdapter(BiasGPTForCausalLM(config).eval(), source="random")
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, seq_len))
    last = config.n_layer - 1
    with full_matrices(adapter, [last]) as got:
        adapter.forward(torch.from_numpy(ids))
    return ids, got.weights[last], got.bias[last]


def write_once(path: Path, ids: np.ndarray, weights: torch.Tensor, bias: torch.Tensor, samples: int,
               dtype: str, filters: dict) -> float:  # fmt: skip
    """Seconds to write ``samples`` copies of one captured sample into a new file."""
    from biasviz.store import BiasFileWriter

    h = weights.shape[1]
    t0 = time.perf_counter()
    with BiasFileWriter(path, attrs={"scheme": "alibi"}, n_samples=samples, n_heads=h, seq_len=ids.shape[1],
                        layers=[11], has_bias=True, dtype=dtype, force=True, **filters) as w:  # fmt: skip
        for _ in range(samples):
            w.write_batch(ids, {11: weights}, {11: bias})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=2, help="samples per file")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    args = parser.parse_args()
    ids, weights, bias = capture(args.seq_len)
    raw = (weights.numel() + bias.numel()) * 4  # float32 bytes of one sample's bias + weights
    print(f"HDF5 write, T={args.seq_len}, 12 heads, bias + weights of one layer ({raw / MIB:.0f} MiB float32 "
          f"per sample), {args.samples} samples per file, {args.runs} runs; medians [min-max]\n")  # fmt: skip
    print("| dtype | filters | s/sample | MiB/s (float32 input) | MiB/sample on disk | ratio to raw |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.h5"
        for dtype in args.dtypes:
            for label, filters in SETTINGS:
                times = [write_once(path, ids, weights, bias, args.samples, dtype, filters) / args.samples
                         for _ in range(args.runs)]  # fmt: skip
                size = path.stat().st_size / args.samples
                med = statistics.median(times)
                print(f"| {dtype} | {label} | {fmt_range(times)} | {raw / MIB / med:.0f} | {size / MIB:.1f} | "
                      f"{size / raw:.3f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
