"""A dense CPU extract by ``--compression``: seconds and file size of gzip, lzf and none at T = 512 .. 2048.

The whole ``extract`` a user runs from Python (forward pass, capture, masking and checks, compression, write) on
the ``tiny`` preset (2 layers, 12 heads, ALiBi, random weights), every layer stored, the settings interleaved
within each repeat so that a slower moment of a shared machine falls on all of them alike. Usage::

    .venv/bin/python bench/extract_compression.py                       # T = 512, 1024, 2048; 3 repeats
    .venv/bin/python bench/extract_compression.py --seq-len 1024 --runs 5 --choices gzip lzf none gzip:6
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MIB, fmt_range  # noqa: E402


def main() -> None:
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.run import extract
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--choices", nargs="+", default=["gzip", "lzf", "none"])
    args = parser.parse_args()
    torch.manual_seed(0)
    config = BiasGPTConfig.from_preset("tiny", "alibi")
    adapter = BiasGPTAdapter(BiasGPTForCausalLM(config).eval(), source="random")
    print(f"extract on the CPU ({torch.get_num_threads()} threads), tiny preset (2 layers x 12 heads, ALiBi), "
          f"bias + weights of every layer, {args.samples} samples, {args.runs} interleaved repeats; "
          "medians [min-max]\n")  # fmt: skip
    print("| T | --compression | s per extract | MiB on disk | ratio to none |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for seq_len in args.seq_len:
            ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(args.samples, seq_len))
            seconds: dict[str, list[float]] = {c: [] for c in args.choices}
            size: dict[str, int] = {}
            for _ in range(args.runs):
                for choice in args.choices:
                    out = Path(tmp) / f"{choice.replace(':', '_')}.h5"
                    t0 = time.perf_counter()
                    extract(adapter, ids, out, layers="all", device="cpu", force=True, progress=False,
                            compression=choice)  # fmt: skip
                    seconds[choice].append(time.perf_counter() - t0)
                    size[choice] = out.stat().st_size
            for choice in args.choices:
                ratio = f"{size[choice] / size['none']:.2f}" if "none" in size else "-"
                print(f"| {seq_len} | {choice} | {fmt_range(seconds[choice])} | {size[choice] / MIB:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
