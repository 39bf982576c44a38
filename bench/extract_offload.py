"""``extract --device-map`` against the same extract in memory: a 1.1B or a 3.2B Llama, mostly on the disk.

A random-weight Llama of TinyLlama's shape (``--shape 1b``: hidden 2048, 22 layers, 32 heads, 4 key-value heads,
vocabulary 32000: 1.1B parameters, 2.05 GiB of bfloat16 on disk) or of Llama-3.2-3B's (``--shape 3b``: hidden 3072,
28 layers, 24 heads, 8 key-value heads, vocabulary 128256, tied embeddings: 3.21B parameters, 5.98 GiB) is made
locally from its config once (nothing is downloaded) and kept in ``--model-dir`` (outside the repository:
~/.cache/biasviz-bench). Each run is one ``biasviz extract --summary --layer -1`` child process at T = 2048, timed,
its peak RSS read from the kernel's accounting of that child alone (``wait4``), and its anonymous memory and mapped
file pages (RssAnon, RssFile) sampled from /proc every 10 ms:

- placed: ``--device-map auto --max-memory cpu=1GiB --offload-folder DIR``: the embedding and what fits in 1 GiB stay
  in memory, every other layer is read from the safetensors file while it runs;
- in memory: the same command without a device map (skip it with ``--placed-only`` where the weights do not fit), or
  with ``--python-twin`` the model loaded by transformers in ``--model-dtype`` and ``biasviz.extract`` on the placed
  run's windows (the command loads float32 and converts, which needs both at once).

Both files' datasets are then compared (largest difference). Peak RSS of the placed run must stay below the size of
the weights. ``--phases`` runs the placed extract in one process phase by phase (loading, probe, summary).

    .venv/bin/python bench/extract_offload.py                         # both runs, 2 samples
    .venv/bin/python bench/extract_offload.py --placed-only --max-memory cpu=512MiB
    .venv/bin/python bench/extract_offload.py --shape 3b --model-dtype bfloat16 --python-twin
    .venv/bin/python bench/extract_offload.py --shape 3b --model-dtype bfloat16 --phases   # after a placed run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

GIB = 1024**3
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "biasviz-bench"
SHAPES = {  # TinyLlama's (1.10B parameters) and Llama-3.2-3B's (3.21B, tied embeddings: 5.98 GiB of bfloat16)
    "1b": {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
           "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 4096},
    "3b": {"vocab_size": 128256, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
           "num_attention_heads": 24, "num_key_value_heads": 8, "max_position_embeddings": 8192,
           "tie_word_embeddings": True, "rope_theta": 500000.0},
}  # fmt: skip
TEXT = "\n".join(f"def step_{i}(state, rate={i / 7:.3f}):\n    return [s * rate + {i} for s in state]  # {i}"
                 for i in range(4000))  # fmt: skip

TWIN = """import sys
import h5py, torch, biasviz
from transformers import AutoModelForCausalLM
model_dir, placed, out, dtype = sys.argv[1:5]
with h5py.File(placed, "r") as f:
    ids = f["input_ids"][()]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa")
biasviz.extract(model.eval(), ids, out, layers=-1, summary=True, force=True, progress=False)
"""  # the same windows as the placed run, the model held in memory in the precision asked for

PHASES = """import json, sys, threading, time
import h5py
model_dir, placed, out, dtype, budget, folder = sys.argv[1:7]
peak = {}

def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f)
                if k in ("RssAnon", "RssFile", "VmRSS")}

def watch():
    while True:
        now = status()
        for key in ("RssAnon", "RssFile"):
            peak[key] = max(peak.get(key, 0), now[key])
        if now["VmRSS"] > peak.get("VmRSS", 0):
            peak["VmRSS"], peak["at_peak"] = now["VmRSS"], now
        time.sleep(0.01)

threading.Thread(target=watch, daemon=True).start()
report = {}

def phase(name, work):
    time.sleep(0.05)
    peak.clear()
    t0 = time.perf_counter()
    got = work()
    time.sleep(0.05)
    report[name] = {"seconds": time.perf_counter() - t0, **peak, "after": status()}
    return got

from biasviz.adapters import load_model
from biasviz.adapters.device_map import placement_from
from biasviz.extraction.summary import extract_summary
with h5py.File(placed, "r") as f:
    ids = f["input_ids"][()]
report["start"] = status()
placement = placement_from("auto", budget, folder, dtype)
adapter = phase("loading", lambda: load_model(model_dir, placement=placement))
phase("probe (64 tokens)", lambda: adapter.prepare(ids, -1))
phase("summary (probe, forward keeping q and k, rows formed again)",
      lambda: extract_summary(adapter, ids, out, layers=-1, force=True, progress=False))
print(json.dumps(report))
"""  # the placed run in one process, phase by phase: the peaks of each (sampled), what stays after it


def make_model(folder: Path, shape: str, layers: int | None = None) -> Path:
    """The random Llama in bfloat16 (made once; a folder whose config says the same shape is reused)."""
    layers = layers or SHAPES[shape]["num_hidden_layers"]
    model_dir = folder / (f"llama-{layers}l" if shape == "1b" else f"llama-{shape}-{layers}l")
    config_file = model_dir / "config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("num_hidden_layers") == layers:
        return model_dir
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    t0 = time.perf_counter()
    config = LlamaConfig(**{**SHAPES[shape], "num_hidden_layers": layers}, dtype="bfloat16")
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: 2.2 GB, never 4.4 GB of float32
    try:
        model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    print(f"made {model_dir}: {params / 1e9:.2f}B parameters in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return model_dir


def weights_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))


def run(argv: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    """One child process: wall time, its own peak RSS (wait4), exit status and its last line; beside them the peaks
    of its anonymous memory and of its mapped file pages (RssAnon, RssFile), sampled every 10 ms from /proc."""
    import tempfile
    import threading

    peaks = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0, "at_peak": {}}

    def sample(pid: int, done: threading.Event) -> None:
        while not done.is_set():
            try:
                with open(f"/proc/{pid}/status") as f:
                    now = {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f)
                           if k in ("RssAnon", "RssFile", "RssShmem", "VmRSS")}  # fmt: skip
            except (OSError, ValueError):
                return
            for key in ("RssAnon", "RssFile"):
                peaks[key] = max(peaks[key], now.get(key, 0))
            if now.get("VmRSS", 0) > peaks["VmRSS"]:
                peaks["VmRSS"], peaks["at_peak"] = now["VmRSS"], now
            done.wait(0.01)

    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        environ = {**os.environ, **(env or {})}
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=environ)
        done = threading.Event()
        sampler = threading.Thread(target=sample, args=(proc.pid, done), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = out.read().strip().splitlines()
    return {"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024, "returncode": proc.returncode,
            "said": lines[-1] if lines else "", "sampled": peaks, "load": os.getloadavg()}  # fmt: skip


def compare(a: Path, b: Path) -> float:
    """The largest difference over every dataset of two files of the same layout."""
    import h5py
    import numpy as np

    largest = 0.0
    with h5py.File(a, "r") as f, h5py.File(b, "r") as g:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for name in names:
            x, y = f[name][()], g[name][()]
            for field in x.dtype.names or (None,):
                u, v = (x, y) if field is None else (x[field], y[field])
                if np.issubdtype(u.dtype, np.floating):
                    both = np.isfinite(u) & np.isfinite(v)
                    largest = max(largest, float(np.abs(u[both] - v[both]).max(initial=0.0)))
    return largest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=CACHE, help="where the random model and the outputs are kept")
    p.add_argument("--shape", default="1b", choices=sorted(SHAPES), help="1b: TinyLlama's; 3b: Llama-3.2-3B's")
    p.add_argument("--layers", type=int, help="decoder layers (default: the shape's own, 22 or 28)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--samples", type=int, default=2, help="two or more: the positional logits need pairs")
    p.add_argument("--max-memory", default="cpu=1GiB")
    p.add_argument("--model-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--placed-only", action="store_true", help="leave out the in-memory run")
    p.add_argument("--phases", action="store_true",
                   help="only the placed run, in one process phase by phase (loading, probe, summary) on placed.h5's "
                        "windows: each phase's peak RssAnon and RssFile and what stays after it")
    p.add_argument("--python-twin", action="store_true",
                   help="the in-memory run from Python instead of the command: the model loaded by transformers in "
                        "--model-dtype (the command loads float32 and converts), biasviz.extract on placed.h5's ids")
    p.add_argument("--fixed-threshold", action="store_true",
                   help="also run in memory with glibc's mmap threshold fixed at 1 MiB, as a placed run sets it")
    args = p.parse_args()
    model_dir = make_model(args.model_dir, args.shape, args.layers)
    args.out_dir = args.model_dir / "out" / model_dir.name
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "text.txt").write_text(TEXT)
    biasviz = str(Path(sys.executable).with_name("biasviz"))
    base = [biasviz, "extract", "--model", str(model_dir), "--summary", "--layer", "-1", "--seq-len", str(args.seq_len),
            "--samples", str(args.samples), "--text", str(args.out_dir / "text.txt"), "--model-dtype", args.model_dtype,
            "--quiet", "--force"]  # fmt: skip
    runs = {"placed": [*base, "--out", str(args.out_dir / "placed.h5"), "--device-map", "auto", "--max-memory",
                       args.max_memory, "--offload-folder", str(args.out_dir / "offload")]}  # fmt: skip
    envs = {}
    if not args.placed_only and args.python_twin:
        runs["in memory"] = [sys.executable, "-c", TWIN, str(model_dir), str(args.out_dir / "placed.h5"),
                             str(args.out_dir / "memory.h5"), args.model_dtype]  # fmt: skip
    elif not args.placed_only:
        runs["in memory"] = [*base, "--out", str(args.out_dir / "memory.h5")]
    if not args.placed_only and args.fixed_threshold:
        runs["in memory, MALLOC_MMAP_THRESHOLD_=1MiB"] = [*base, "--out", str(args.out_dir / "memory-fixed.h5")]
        envs["in memory, MALLOC_MMAP_THRESHOLD_=1MiB"] = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    if args.phases:
        argv = [sys.executable, "-c", PHASES, str(model_dir), str(args.out_dir / "placed.h5"),
                str(args.out_dir / "phases.h5"), args.model_dtype, args.max_memory, str(args.out_dir / "offload")]
        r = run(argv)
        print("| phase | s | peak RSS GiB | peak RssAnon | peak RssFile | after: anon + file |\n"
              "| --- | ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
        phases = json.loads(r["said"])
        for name, got in phases.items():
            if name != "start":
                print(f"| {name} | {got['seconds']:.0f} | {got['VmRSS'] / GIB:.2f} | {got['RssAnon'] / GIB:.2f} | "
                      f"{got['RssFile'] / GIB:.2f} | {got['after']['RssAnon'] / GIB:.2f} + "
                      f"{got['after']['RssFile'] / GIB:.2f} |")  # fmt: skip
        print(json.dumps({"phases": phases, "run": r}, indent=1))
        return
    on_disk = weights_bytes(model_dir)
    in_run = on_disk * (2 if args.model_dtype == "float32" else 1)  # bfloat16 on disk
    results = {name: run(argv, envs.get(name)) for name, argv in runs.items()}
    print(f"model: {model_dir} ({on_disk / GIB:.2f} GiB of bfloat16 weights on disk, {in_run / GIB:.2f} GiB in "
          f"{args.model_dtype}); T = {args.seq_len}, {args.samples} samples, --summary --layer -1, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print("\n| run | wall (s) | peak RSS (GiB) | peak RSS / weights in memory | peak RssAnon | peak RssFile | "
          "at the peak: anon + file | load average |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in results.items():
        label = f"{name} (`--max-memory {args.max_memory}`)" if name == "placed" else name
        if r["returncode"] != 0:
            print(f"| {label} | failed ({r['returncode']}): {r['said']} | | | | | | |")
            continue
        sampled = r["sampled"]
        at = sampled["at_peak"]
        print(f"| {label} | {r['seconds']:.0f} | {r['peak_rss'] / GIB:.2f} | {r['peak_rss'] / in_run:.2f} | "
              f"{sampled['RssAnon'] / GIB:.2f} | {sampled['RssFile'] / GIB:.2f} | {at.get('RssAnon', 0) / GIB:.2f} + "
              f"{at.get('RssFile', 0) / GIB:.2f} | {r['load'][0]:.1f} |")  # fmt: skip
    if len(results) >= 2 and all(r["returncode"] == 0 for r in results.values()):
        gap = compare(args.out_dir / "placed.h5", args.out_dir / "memory.h5")
        print(f"\nlargest difference between the two files' datasets: {gap:.3g}")
    print(json.dumps({"weights_on_disk": on_disk, "results": results}, indent=1))


if __name__ == "__main__":
    main()
