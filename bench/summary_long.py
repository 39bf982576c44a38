"""``extract --summary`` against the bare forward at the same length, in fresh processes (BENCHMARKS.md §7).

Each measurement is one child process (peak RSS is a per-process high-water mark): it builds a randomly
initialised model of the preset, then either runs the bare forward through the captured layer (the model's
own attention, no hook listening) or ``extract_summary`` of that layer, and prints JSON. Nothing is downloaded.

    .venv/bin/python bench/summary_long.py                                    # tiny, T = 16384 32768 65536
    .venv/bin/python bench/summary_long.py --preset gpt2-small --seq-len 512 --samples 4 64 --resolution 512
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

GIB = 1024**3


def child(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.summary import extract_summary
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    if args.bank_bytes is not None:  # how much of the bank stays in memory (0: all of it in the temporary file)
        import biasviz.summaries.bank as bank

        bank.BANK_BYTES = args.bank_bytes
    torch.manual_seed(0)
    config = BiasGPTConfig.from_preset(args.preset, args.scheme)
    model = BiasGPTForCausalLM(config).eval()
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(args.samples[0], args.seq_len))
    adapter = BiasGPTAdapter(model, source="random")
    layer = adapter.resolve_layers(args.layer)
    out: dict[str, object] = {"mode": args.mode, "samples": args.samples[0], "seq_len": args.seq_len}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        if args.mode == "forward":
            with adapter.stopping_after(layer):
                for s in range(0, len(ids), args.batch_size):
                    adapter.forward(torch.from_numpy(ids[s : s + args.batch_size]))
        else:
            result = extract_summary(adapter, ids, Path(tmp) / "s.h5", layers=args.layer, resolution=args.resolution,
                                     batch_size=args.batch_size, device="cpu", progress=False,
                                     positional=not args.no_positional)  # fmt: skip
            out["file_bytes"] = result.bytes
        out["seconds"] = time.perf_counter() - t0
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["threads"] = torch.get_num_threads()
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--scheme", default="alibi")
    p.add_argument("--seq-len", type=int, nargs="+", default=[16384, 32768, 65536])
    p.add_argument("--samples", type=int, nargs="+", default=[1])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--resolution", type=int, default=1024)
    p.add_argument("--layer", default="-1")
    p.add_argument("--no-positional", action="store_true", help="leave out the positional logits P (their cost)")
    p.add_argument("--bank-bytes", type=int, help="bytes of the bank kept in memory (default 1 GiB; 0: all on disk)")
    p.add_argument("--repeat", type=int, default=1, help="fresh processes per measurement; the median is shown")
    p.add_argument("--mode", choices=["forward", "summary"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        args.seq_len = args.seq_len[0]
        args.layer = "all" if args.layer == "all" else int(args.layer)
        child(args)
        return
    print(f"preset {args.preset}, scheme {args.scheme}, layer {args.layer}, R = {args.resolution}, CPU"
          + (", without P" if args.no_positional else ""))
    print("| T | samples | bare forward (s) | summary (s) | ratio | summary s/sample | peak RSS forward | "
          "peak RSS summary | file |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in args.seq_len:
        for n in args.samples:
            got = {}
            for mode in ("forward", "summary"):
                cmd = [sys.executable, __file__, "--mode", mode, "--preset", args.preset, "--scheme", args.scheme,
                       "--seq-len", str(t), "--samples", str(n), "--batch-size", str(args.batch_size),
                       "--resolution", str(min(args.resolution, t)), "--layer", args.layer,
                       *(["--no-positional"] if args.no_positional else []),
                       *([] if args.bank_bytes is None else ["--bank-bytes", str(args.bank_bytes)])]  # fmt: skip
                runs = []
                for _ in range(args.repeat):  # forward and summary alternate run by run would be fairer; close enough
                    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                    if proc.returncode != 0:
                        sys.exit(f"{mode} at T={t} failed:\n{proc.stderr[-2000:]}")
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                got[mode] = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
            f, s = got["forward"], got["summary"]
            print(f"| {t} | {n} | {f['seconds']:.2f} | {s['seconds']:.2f} | {s['seconds'] / f['seconds']:.2f} | "
                  f"{s['seconds'] / n:.2f} | "
                  f"{f['peak_rss'] / GIB:.2f} GiB | {s['peak_rss'] / GIB:.2f} GiB | {s['file_bytes'] / 1e6:.1f} MB |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
