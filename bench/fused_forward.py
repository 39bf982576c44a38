"""Our GPT-2 family against the fused floor: transformers GPT-2 with SDPA ``is_causal`` (BENCHMARKS.md §13).

Every row is one fresh child process (its own peak memory, VmHWM): it builds a randomly initialised model of
GPT-2-small's shape (transformers' GPT2LMHeadModel with n_positions = T for the floor; our preset otherwise),
then times one forward of one window of T tokens without gradients (``forward``), ``extract_summary`` of the
last layer at resolution 1024 (``summary``), or training steps (``train``). ``attention`` picks our path:
``auto`` (FlexAttention where it pays), ``sdpa`` (the blocked SDPA path with a bias mask). Nothing is downloaded.

    .venv/bin/python bench/fused_forward.py --seq-len 8192 16384 --schemes alibi kerple-log t5 --summary alibi
    .venv/bin/python bench/fused_forward.py --train --seq-len 1024 --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GIB, peak_hwm_bytes  # noqa: E402


def floor_model(seq_len: int):  # -> transformers GPT2LMHeadModel
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=seq_len, n_embd=768, n_layer=12, n_head=12, attn_implementation="sdpa")
    return GPT2LMHeadModel(config)


def our_model(scheme: str, seq_len: int):  # -> BiasGPTForCausalLM
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    config = BiasGPTConfig.from_preset("gpt2-small", scheme)
    if scheme == "learned":
        config.n_positions = max(config.n_positions, seq_len)
    return BiasGPTForCausalLM(config)


def child(args: argparse.Namespace) -> dict[str, object]:
    import numpy as np
    import torch

    torch.manual_seed(0)
    model = floor_model(args.seq_len) if args.scheme == "floor" else our_model(args.scheme, args.seq_len)
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    out: dict[str, object] = {}
    if args.mode == "train":
        model.train()
        for module in model.modules():  # no dropout: the same arithmetic in both models
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times = []
        for _ in range(args.steps):
            ids = torch.from_numpy(rng.integers(0, vocab, size=(args.batch_size, args.seq_len)))
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
        out["step_s"] = float(np.median(times[1:] if len(times) > 1 else times))
    elif args.mode == "forward":
        model.eval()
        ids = torch.from_numpy(rng.integers(0, vocab, size=(1, args.seq_len)))
        with torch.no_grad():
            t0 = time.perf_counter()
            model(input_ids=ids)
            out["first_s"] = time.perf_counter() - t0
            if args.repeat:
                t0 = time.perf_counter()
                model(input_ids=ids)
                out["warm_s"] = time.perf_counter() - t0
    else:
        from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
        from biasviz.extraction.summary import extract_summary

        ids = rng.integers(0, vocab, size=(args.samples, args.seq_len))
        adapter = BiasGPTAdapter(model.eval(), source="random")
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            extract_summary(adapter, ids, Path(tmp) / "s.h5", layers=-1, resolution=args.resolution,
                            batch_size=1, device="cpu", progress=False, positional=args.samples > 1)  # fmt: skip
            out["first_s"] = time.perf_counter() - t0
    out["peak_gib"] = peak_hwm_bytes() / GIB
    return out


def run_child(argv: list[str], attention: str) -> dict[str, object]:
    env = {**os.environ, "BIASVIZ_ATTENTION": attention}
    done = subprocess.run([sys.executable, __file__, "--child", *argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[8192])
    parser.add_argument("--schemes", nargs="+", default=["alibi", "kerple-log", "t5"])
    parser.add_argument("--attention", nargs="+", default=["auto"], choices=["auto", "flex", "table", "sdpa"])
    parser.add_argument("--summary", nargs="*", default=None, metavar="SCHEME",
                        help="also extract --summary (R = --resolution) of these schemes (none named: every one)")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--train", action="store_true", help="training steps instead of forwards")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeat", action="store_true", help="time a second, warm forward too")
    parser.add_argument("--no-floor", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="forward", help=argparse.SUPPRESS)
    parser.add_argument("--scheme", default="floor", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.seq_len = args.seq_len[0]
        print(json.dumps(child(args)))
        return
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    mode = "train" if args.train else "forward"
    common = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--samples", str(args.samples),
              "--resolution", str(args.resolution)] + (["--repeat"] if args.repeat else [])  # fmt: skip
    for seq_len in args.seq_len:
        rows: list[tuple[str, str, str, dict[str, object]]] = []
        base = ["--seq-len", str(seq_len), *common]
        if not args.no_floor:
            rows.append(("floor", "-", mode, run_child([*base, "--mode", mode, "--scheme", "floor"], "sdpa")))
            print_row(seq_len, *rows[-1], rows[0][3])
        for scheme in args.schemes:
            for attention in args.attention:
                summary = args.summary is not None and (not args.summary or scheme in args.summary)
                modes = [mode] + (["summary"] if summary and not args.train else [])
                for m in modes:
                    rows.append((scheme, attention, m, run_child([*base, "--mode", m, "--scheme", scheme], attention)))
                    print_row(seq_len, *rows[-1], rows[0][3])


def print_row(seq_len: int, scheme: str, attention: str, mode: str, r: dict[str, object], floor: dict) -> None:
    if "error" in r:
        print(f"T={seq_len:<6} {scheme:<11} {attention:<5} {mode:<8} error: {r['error']}", flush=True)
        return
    key = "step_s" if mode == "train" else "first_s"
    ratio = r[key] / floor[key] if key in floor and floor is not r else 1.0
    warm = f" warm {r['warm_s']:7.1f} s" if "warm_s" in r else ""
    print(f"T={seq_len:<6} {scheme:<11} {attention:<5} {mode:<8} {r[key]:8.1f} s{warm}  x{ratio:5.2f}  "
          f"peak {r['peak_gib']:5.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
