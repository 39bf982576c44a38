"""``extract --device-map`` against the same extract in memory: a 1.1B-parameter Llama, mostly on the disk.

A random-weight Llama of TinyLlama's shape (hidden 2048, 22 layers, 32 heads, 4 key-value heads, vocabulary 32000:
1.1B parameters, 2.2 GB of bfloat16 on disk) is made locally from its config once (nothing is downloaded) and kept
in ``--model-dir`` (outside the repository: ~/.cache/biasviz-bench). Each run is one ``biasviz extract --summary
--layer -1`` child process at T = 2048, timed, its peak RSS read from the kernel's accounting of that child alone
(``wait4``):

- placed: ``--device-map auto --max-memory cpu=1GiB --offload-folder DIR``: the embedding and what fits in 1 GiB stay
  in memory, every other layer is read from the safetensors file while it runs;
- in memory: the same command without a device map (skip it with ``--placed-only`` where 4.4 GB of float32 weights
  do not fit).

Both files' datasets are then compared (largest difference). Peak RSS of the placed run must stay below the size of
the weights.

    .venv/bin/python bench/extract_offload.py                         # both runs, 2 samples
    .venv/bin/python bench/extract_offload.py --placed-only --max-memory cpu=512MiB
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
SHAPE = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
         "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 4096}  # fmt: skip
TEXT = "\n".join(f"def step_{i}(state, rate={i / 7:.3f}):\n    return [s * rate + {i} for s in state]  # {i}"
                 for i in range(4000))  # fmt: skip


def make_model(folder: Path, layers: int) -> Path:
    """The random Llama in bfloat16 (made once; a folder whose config says the same shape is reused)."""
    model_dir = folder / f"llama-{layers}l"
    config_file = model_dir / "config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("num_hidden_layers") == layers:
        return model_dir
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    t0 = time.perf_counter()
    config = LlamaConfig(**{**SHAPE, "num_hidden_layers": layers}, dtype="bfloat16")
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
    """One child process: wall time, its own peak RSS (wait4), exit status and its last line."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        environ = {**os.environ, **(env or {})}
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=environ)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = out.read().strip().splitlines()
    return {"seconds": seconds, "peak_rss": usage.ru_maxrss * 1024, "returncode": proc.returncode,
            "said": lines[-1] if lines else ""}  # fmt: skip


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
    p.add_argument("--layers", type=int, default=22, help="decoder layers (22: 1.1B parameters)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--samples", type=int, default=2, help="two or more: the positional logits need pairs")
    p.add_argument("--max-memory", default="cpu=1GiB")
    p.add_argument("--model-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--placed-only", action="store_true", help="leave out the in-memory run")
    p.add_argument("--fixed-threshold", action="store_true",
                   help="also run in memory with glibc's mmap threshold fixed at 1 MiB, as a placed run sets it")
    args = p.parse_args()
    args.out_dir = args.model_dir / "out"

    model_dir = make_model(args.model_dir, args.layers)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "text.txt").write_text(TEXT)
    biasviz = str(Path(sys.executable).with_name("biasviz"))
    base = [biasviz, "extract", "--model", str(model_dir), "--summary", "--layer", "-1", "--seq-len", str(args.seq_len),
            "--samples", str(args.samples), "--text", str(args.out_dir / "text.txt"), "--model-dtype", args.model_dtype,
            "--quiet", "--force"]  # fmt: skip
    runs = {"placed": [*base, "--out", str(args.out_dir / "placed.h5"), "--device-map", "auto", "--max-memory",
                       args.max_memory, "--offload-folder", str(args.out_dir / "offload")]}  # fmt: skip
    envs = {}
    if not args.placed_only:
        runs["in memory"] = [*base, "--out", str(args.out_dir / "memory.h5")]
    if not args.placed_only and args.fixed_threshold:
        runs["in memory, MALLOC_MMAP_THRESHOLD_=1MiB"] = [*base, "--out", str(args.out_dir / "memory-fixed.h5")]
        envs["in memory, MALLOC_MMAP_THRESHOLD_=1MiB"] = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    on_disk = weights_bytes(model_dir)
    in_run = on_disk * (2 if args.model_dtype == "float32" else 1)  # bfloat16 on disk
    results = {name: run(argv, envs.get(name)) for name, argv in runs.items()}
    print(f"model: {model_dir} ({on_disk / GIB:.2f} GiB of bfloat16 weights on disk, {in_run / GIB:.2f} GiB in "
          f"{args.model_dtype}); T = {args.seq_len}, {args.samples} samples, --summary --layer -1, "
          f"{os.cpu_count()} cores")  # fmt: skip
    print("\n| run | wall (s) | peak RSS (GiB) | peak RSS / weights in memory |\n| --- | ---: | ---: | ---: |")
    for name, r in results.items():
        label = f"{name} (`--max-memory {args.max_memory}`)" if name == "placed" else name
        if r["returncode"] != 0:
            print(f"| {label} | failed ({r['returncode']}): {r['said']} | | |")
            continue
        print(f"| {label} | {r['seconds']:.0f} | {r['peak_rss'] / GIB:.2f} | {r['peak_rss'] / in_run:.2f} |")
    if len(results) >= 2 and all(r["returncode"] == 0 for r in results.values()):
        gap = compare(args.out_dir / "placed.h5", args.out_dir / "memory.h5")
        print(f"\nlargest difference between the two files' datasets: {gap:.3g}")
    print(json.dumps({"weights_on_disk": on_disk, "results": results}, indent=1))


if __name__ == "__main__":
    main()
