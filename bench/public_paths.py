"""The public paths against the fused floor, in fresh processes, repeats interleaved (BENCHMARKS.md §13).

For each T and number of samples N, one round runs every kind once, each in a fresh process, and the rounds repeat
(floor, ours, ..., floor, ours, ...), so that a machine whose load changes slows every kind alike:

- ``floor``: transformers' GPT2LMHeadModel (SDPA, the causal kernel) of the model's shape and vocabulary, N forwards
  of one window of T tokens without gradients (logits included).
- ``forward``: our model as ``BiasGPTForCausalLM.from_pretrained(DIR)`` loads it, the same N forwards.
- ``api``: ``biasviz.extract(model, ids, out, layers=-1, summary=True, resolution=R)`` on that module.
- ``api-dir``: ``biasviz.extract(DIR, ids, out, ...)``, loading included.
- ``cli``: ``biasviz extract --model DIR --summary --samples N --seq-len T``: the process's wall time, start-up,
  imports, tokenizing and the write included (its windows are text cut by the checkpoint's tokenizer).

Scores and P as they default. The times of the other kinds are taken in the process around the work itself. The
model is DIR (``--model``) or one written by ``biasviz train --preset gpt2-small --scheme alibi --steps 1``. Each
table says the CPU model (/proc/cpuinfo), torch's CPU capability as the processes saw it, and the load average
before and after; ``--capabilities default,avx2`` runs everything again with ``ATEN_CPU_CAPABILITY=avx2``.

    .venv/bin/python bench/public_paths.py --seq-lens 8192,16384,32768 --repeats 3 --samples 1,8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import GIB, peak_hwm_bytes  # noqa: E402

KINDS = ("floor", "forward", "api", "api-dir", "cli")


def child(args: argparse.Namespace) -> dict[str, object]:
    import numpy as np
    import torch

    torch.manual_seed(0)
    out: dict[str, object] = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    config = json.loads((Path(args.model) / "config.json").read_text())
    ids = np.random.default_rng(0).integers(0, config["vocab_size"], size=(args.samples, args.seq_len))
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "s.h5"
        if args.kind in ("floor", "forward"):
            model = floor_model(config, args.seq_len) if args.kind == "floor" else ours(args.model)
            t0 = time.perf_counter()
            with torch.no_grad():
                for row in ids:
                    model(input_ids=torch.from_numpy(row[None]))
        else:
            import biasviz

            extract = biasviz.extract  # its modules imported here, as the floor's are before its clock starts
            given = ours(args.model) if args.kind == "api" else args.model
            t0 = time.perf_counter()
            extract(given, ids, target, layers=-1, summary=True, resolution=args.resolution, progress=False)
        out["s"] = time.perf_counter() - t0
    out["peak_gib"] = peak_hwm_bytes() / GIB
    return out


def floor_model(config: dict, seq_len: int):  # -> transformers GPT2LMHeadModel
    from transformers import GPT2Config, GPT2LMHeadModel

    keys = ("n_embd", "n_layer", "n_head", "vocab_size")
    shape = GPT2Config(n_positions=seq_len, attn_implementation="sdpa", **{key: config[key] for key in keys})
    return GPT2LMHeadModel(shape).eval()


def ours(directory: str):  # -> BiasGPTForCausalLM
    from biasviz.model import BiasGPTForCausalLM

    return BiasGPTForCausalLM.from_pretrained(directory).eval()


def run(kind: str, seq_len: int, samples: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, object]:
    """One fresh process of ``kind``: its time, peak memory and the CPU capability it ran with."""
    if kind == "cli":
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, "-m", "biasviz", "extract", "--model", args.model, "--summary", "--resolution",
                       str(args.resolution), "--samples", str(samples), "--seq-len", str(seq_len), "--device", "cpu",
                       "--out", str(Path(tmp) / "s.h5"), "--quiet"]  # fmt: skip
            t0 = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            took = time.perf_counter() - t0
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
        return {"s": took}
    command = [sys.executable, __file__, "--child", "--kind", kind, "--model", args.model, "--seq-lens", str(seq_len),
               "--samples", str(samples), "--resolution", str(args.resolution)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def table(capability: str, args: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    if capability != "default":
        env["ATEN_CPU_CAPABILITY"] = capability
    seen: set[str] = set()
    forced = env.get("ATEN_CPU_CAPABILITY", "(unset)")
    print(f"\nCPU: {cpu_model()}, {os.cpu_count()} cores; ATEN_CPU_CAPABILITY={forced}; load average (1, 5, 15 min) "
          f"before: {load()}", flush=True)  # fmt: skip
    print("\n| T | N | run | min (s) | median (s) | x floor (min) | x floor (median) | peak memory | load at start |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |", flush=True)
    for seq_len in args.seq_lens:
        for samples in args.samples:
            times: dict[str, list[float]] = {kind: [] for kind in args.kinds}
            peaks: dict[str, float] = {}
            loads: dict[str, list[float]] = {kind: [] for kind in args.kinds}
            errors: dict[str, str] = {}
            for _ in range(args.repeats):
                for kind in args.kinds:  # interleaved: floor, ours, ..., floor, ours, ...
                    loads[kind].append(os.getloadavg()[0])
                    got = run(kind, seq_len, samples, args, env)
                    if "error" in got:
                        errors[kind] = str(got["error"])
                        continue
                    times[kind].append(float(got["s"]))
                    peaks[kind] = max(peaks.get(kind, 0.0), float(got.get("peak_gib", 0.0)))
                    # each run as it ends, so that a long run stopped part-way keeps what it measured
                    print(f"run: T = {seq_len}, N = {samples}, {kind}, repeat {len(times[kind])}: {got['s']:.1f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
                    if "capability" in got:
                        seen.add(f"{got['capability']} ({got['threads']} threads)")
            floor = times.get("floor") or []
            for kind in args.kinds:
                if kind in errors and not times[kind]:
                    print(f"| {seq_len} | {samples} | {kind} | error: {errors[kind]} | | | | | |", flush=True)
                    continue
                low, mid = min(times[kind]), statistics.median(times[kind])
                ratio = f"{low / min(floor):.2f} | {mid / statistics.median(floor):.2f}" if floor else " | "
                peak = f"{peaks[kind]:.2f} GiB" if peaks.get(kind) else "-"
                span = f"{min(loads[kind]):.1f}-{max(loads[kind]):.1f}"
                row = f"| {seq_len} | {samples} | {kind} | {low:.1f} | {mid:.1f} | {ratio} | {peak} | {span} |"
                print(row, flush=True)
    print(f"\ntorch CPU capability in the processes: {', '.join(sorted(seen)) or '-'}; load average after: {load()}; "
          f"{args.repeats} interleaved repeats per row (cli: the process's wall time)", flush=True)  # fmt: skip


def trained_model(directory: Path) -> str:
    """A GPT-2-small-shaped ALiBi checkpoint written by ``biasviz train`` (one step), as users make one."""
    command = [sys.executable, "-m", "biasviz", "train", "--scheme", "alibi", "--preset", "gpt2-small", "--steps", "1",
               "--seq-len", "128", "--batch-size", "1", "--out", str(directory), "--quiet"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    subprocess.run(command, check=True, env=env, capture_output=True)
    return str(directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    numbers = lambda text: [int(x) for x in str(text).split(",") if x]  # noqa: E731
    parser.add_argument("--seq-lens", type=numbers, default=[4096], help="comma-separated lengths T")
    parser.add_argument("--samples", type=numbers, default=[1], help="comma-separated numbers of samples N")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--kinds", type=lambda t: t.split(","), default=list(KINDS), help=",".join(KINDS))
    forced = "'default' and/or values of ATEN_CPU_CAPABILITY (avx2, avx512, ...): a table each"
    parser.add_argument("--capabilities", type=lambda t: t.split(","), default=["default"], help=forced)
    parser.add_argument("--model", default=None, help="a biasviz checkpoint directory [default: one trained here]")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="floor", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.seq_len, args.samples = args.seq_lens[0], args.samples[0]
        print(json.dumps(child(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            args.model = trained_model(Path(tmp) / "alibi-gpt2-small")
        for capability in args.capabilities:
            table(capability, args)


if __name__ == "__main__":
    main()
