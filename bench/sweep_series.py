"""A 20-checkpoint sweep on the CPU: one process against two (torchrun), and what resuming an interrupted one costs.

    .venv/bin/python bench/sweep_series.py [--checkpoints 20] [--samples 8] [--seq-len 256] [--repeats 2]

The checkpoints are tiny random GPT-NeoX models (Pythia's architecture, traced) saved as revisions step0 ...
in a temporary Hugging Face cache, as ``hf download`` leaves them. Each run is the CLI in a fresh process,
``--layer all``, full files. The interrupted run gets SIGINT once half the checkpoints are finished, and
``--resume`` completes it; the resumed file is compared with the uninterrupted one dataset by dataset.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.series_models import save_revision, tiny_neox  # noqa: E402

REPO = "bench/pythia-tiny"


def command(args: argparse.Namespace, out: str, processes: int, resume: bool = False, which: str = "all") -> list[str]:
    cli = ["-m", "biasviz", "extract", "--model", REPO, "--checkpoints", which, "--samples", str(args.samples),
           "--seq-len", str(args.seq_len), "--layer", "all", "--text", "text.txt", "--device", "cpu", "--quiet",
           "--out", out, *(["--resume"] if resume else [])]  # fmt: skip
    if processes == 1:
        return [sys.executable, *cli]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", *cli]


def cpu_seconds() -> float:
    """User + system time of every finished child process so far (less sensitive to other load than wall time)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, cpu_seconds() - c0


def interrupted(cmd: list[str], cwd: Path, env: dict[str, str], partial: Path,
                after: int) -> tuple[tuple[float, float], int]:  # fmt: skip
    """Run until ``after`` checkpoints are finished, then SIGINT (a Ctrl-C): (wall, CPU) seconds and parts kept."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and len(list(partial.glob("step-*.h5"))) < after:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate()
    assert proc.returncode == 130 and "--resume" in err, err
    return (time.perf_counter() - t0, cpu_seconds() - c0), len(list(partial.glob("step-*.h5")))


def same(a: Path, b: Path) -> bool:
    with h5py.File(a) as fa, h5py.File(b) as fb:
        names: list[str] = []
        fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        return all(fa[n][()].tobytes() == fb[n][()].tobytes() for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = work / "cache"
        steps = [0, *[2**k for k in range(args.checkpoints - 1)]]
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        for k, step in enumerate(steps):
            save_revision(cache, REPO, f"step{step}", tiny_neox(k))
        (work / "text.txt").write_text((ROOT / "README.md").read_text(encoding="utf-8") * 4)
        env = {**os.environ, "HF_HUB_CACHE": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
        rows = [("1 process, first checkpoint only (a run's fixed cost)",
                 [timed(command(args, f"first-{r}.h5", 1, which="first"), work, env) for r in range(args.repeats)])]
        for processes in (1, 2):
            env_p = env if processes == 2 else {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}
            times = []
            for r in range(args.repeats):
                out = work / f"p{processes}-{r}.h5"
                times.append(timed(command(args, out.name, processes), work, env_p))
            rows.append((f"{processes} process{'es' if processes > 1 else ''}", times))
        one, two = work / "p1-0.h5", work / "p2-0.h5"
        env_1 = {k: v for k, v in env.items() if k != "OMP_NUM_THREADS"}
        cut, resumed = [], []
        for r in range(args.repeats):
            out = work / f"resumed-{r}.h5"
            spent, kept = interrupted(command(args, out.name, 1), work, env_1, work / f"{out.name}.partial",
                                      args.checkpoints // 2)  # fmt: skip
            cut.append(spent)
            resumed.append(timed(command(args, out.name, 1, resume=True), work, env_1))
            assert same(one, out), "the resumed file differs from the uninterrupted one"
        assert same(one, two), "two processes differ from one"
        print(f"{len(steps)} checkpoints, {args.samples} samples x T = {args.seq_len}, all layers; "
              f"file {one.stat().st_size / 1e6:.1f} MB; {os.cpu_count()} cores")  # fmt: skip
        print("| run | wall s, median [min-max] | CPU s (all processes), median [min-max] |\n| --- | --- | --- |")
        total = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(cut, resumed, strict=True)]
        rows += [("interrupted at half (until SIGINT)", cut), ("--resume (the other half + join)", resumed),
                 ("interrupted + resumed", total)]
        for name, runs in rows:
            cells = []
            for values in ([r[0] for r in runs], [r[1] for r in runs]):
                cells.append(f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]")
            print(f"| {name} | {cells[0]} | {cells[1]} |")
        print(f"load average while measuring: {os.getloadavg()[0]:.1f}")
        print(f"parts kept at the interrupt: {kept}; resumed file equals the uninterrupted one: True; "
              f"two processes equal one: True")  # fmt: skip


if __name__ == "__main__":
    main()
