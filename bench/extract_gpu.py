"""Final-layer extraction on a CUDA GPU: biasviz against the bare fused forward, transformers and nnsight.

One process per sequence length T (all tools at that T in the same run, one after the other); each tool
builds its model on the GPU, runs one untimed warm-up pass and ``--runs`` timed passes of one sample.
Times are wall-clock with the GPU synchronised; peak GPU memory is ``torch.cuda.max_memory_allocated``
after the tool's own reset (tensors only; the CUDA context adds about 0.5 GiB to what nvidia-smi shows).
Shapes are GPT-2 small's (12 layers, 12 heads, width 768, vocabulary 50257), random weights, float32
unless the tool's name says bf16, TF32 off (PyTorch's default): nothing is downloaded.

Tools:
  floor           biasviz's model, ``model(ids)`` under inference mode: fused SDPA with the ALiBi mask, logits
  floor-bf16      the same in bfloat16
  hf-sdpa         transformers GPT2LMHeadModel with SDPA attention (no weights returned), logits
  biasviz-cap     capture of layer 11's bias and weights, left on the GPU (no copy, no file)
  biasviz         ``biasviz.extraction.run.extract`` of layer 11 to HDF5 (gzip-1 + shuffle), the whole call
  biasviz-bf16    the same with ``model_dtype="bfloat16"`` (weights stored as float32)
  hf              transformers, eager attention, ``output_attentions=True`` (all 12 layers, on the GPU)
  nnsight         nnsight ``trace`` saving layer 11's attention weights of the same transformers model

Then, for biasviz, where the time of one extract goes, each phase measured on its own: compute (the
capture), preparing the matrices on the GPU and copying their bytes into pinned memory, compression of
every matrix (one thread per core, no file), and the HDF5 write of the compressed chunks.

    python bench/extract_gpu.py --seq-len 1024 4096 8192 16384 --json gpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LAYERS, HEADS, WIDTH, VOCAB = 12, 12, 768, 50257
LAST = LAYERS - 1
TOOLS = ["floor", "floor-bf16", "hf-sdpa", "biasviz-cap", "biasviz", "biasviz-bf16", "hf", "nnsight"]
GIB = 2**30


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def _ids(seq_len: int) -> object:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (1, seq_len), generator=g)


def _biasviz_model(dtype: str = "float32") -> object:
    import torch

    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    torch.manual_seed(0)
    model = BiasGPTForCausalLM(BiasGPTConfig.from_preset("gpt2-small", "alibi")).eval()
    return model.to("cuda", getattr(torch, dtype))


def _gpt2(seq_len: int, attn: str) -> object:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, vocab_size=VOCAB,
                        n_positions=max(1024, seq_len), attn_implementation=attn)  # fmt: skip
    return GPT2LMHeadModel(config).eval().cuda()


def build(tool: str, seq_len: int, tmp: Path) -> Callable[[], object]:
    """The timed call of ``tool`` at ``seq_len`` (model built and moved to the GPU here)."""
    import torch

    ids = _ids(seq_len)
    gpu_ids = ids.cuda()
    if tool in ("floor", "floor-bf16"):
        model = _biasviz_model("bfloat16" if tool.endswith("bf16") else "float32")

        def run() -> object:
            with torch.inference_mode():
                return model(gpu_ids).logits.shape

        return run
    if tool == "hf-sdpa":
        model = _gpt2(seq_len, "sdpa")
        return lambda: _inference(lambda: model(gpu_ids).logits.shape)
    if tool in ("biasviz-cap", "biasviz", "biasviz-bf16"):
        from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
        from biasviz.extraction.full_matrices import full_matrices
        from biasviz.extraction.run import extract

        model = _biasviz_model()
        adapter = BiasGPTAdapter(model, source="random")
        if tool == "biasviz-cap":

            def run() -> object:
                with full_matrices(adapter, [LAST]) as got:
                    adapter.forward(gpu_ids)
                    return got.weights[LAST].shape, got.bias[LAST].shape

            return run
        model_dtype = "bfloat16" if tool.endswith("bf16") else None

        def run() -> object:
            return extract(adapter, ids.numpy(), tmp / "x.h5", device="cuda", model_dtype=model_dtype,
                           force=True, progress=False).bytes  # fmt: skip

        return run
    if tool == "hf":
        model = _gpt2(seq_len, "eager")
        return lambda: _inference(lambda: model(gpu_ids, output_attentions=True).attentions[LAST].shape)
    if tool == "nnsight":
        from nnsight import NNsight

        wrapped = NNsight(_gpt2(seq_len, "eager"))

        def run() -> object:
            with torch.inference_mode(), wrapped.trace(gpu_ids):
                weights = wrapped.transformer.h[LAST].attn.output[1].save()  # (1, H, T, T)
            return weights.shape

        return run
    raise ValueError(tool)


def _inference(fn: Callable[[], object]) -> object:
    import torch

    with torch.inference_mode():
        return fn()


def measure(tool: str, seq_len: int, runs: int, tmp: Path) -> dict:
    """Warm-up, then ``runs`` synchronised timings and the peak GPU memory of the tool alone."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    try:
        run = build(tool, seq_len, tmp)
        check = run()
        _sync()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            run()
            _sync()
            times.append(time.perf_counter() - t0)
        out = {"tool": tool, "T": seq_len, "times": times, "peak_gib": (torch.cuda.max_memory_allocated() - base) / GIB,
               "check": str(check)}  # fmt: skip
    except torch.OutOfMemoryError:
        out = {"tool": tool, "T": seq_len, "skipped": "out of GPU memory"}
    except Exception as exc:  # a peer that fails is reported, not fatal
        out = {"tool": tool, "T": seq_len, "skipped": f"{type(exc).__name__}: {str(exc)[:120]}"}
    run = None
    gc.collect()
    torch.cuda.empty_cache()
    return out


def phases(seq_len: int, runs: int, tmp: Path) -> dict:
    """Where one extract's time goes, each phase of the CUDA path timed alone (median of ``runs``).

    compute: the forward pass with capture; prepare + copy: masking, cast and shuffle on the GPU and the
    copy of the bytes into pinned host memory; compress: deflate of every matrix in the writer's thread
    pool; write: HDF5 chunk writes of the compressed bytes (page cache).
    """
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.full_matrices import full_matrices
    from biasviz.store import BiasFileWriter
    from biasviz.store.deflate import deflate
    from biasviz.store.gpu_encode import GpuChunkEncoder

    adapter = BiasGPTAdapter(_biasviz_model(), source="random")
    ids = _ids(seq_len).cuda()
    enc = GpuChunkEncoder(torch.device("cuda"), seq_len=seq_len, storage=np.dtype("float32"), causal=True, level=1,
                          shuffle=True)  # fmt: skip
    host = [torch.empty(seq_len * seq_len * 4, dtype=torch.uint8, pin_memory=True) for _ in range(2 * HEADS)]
    pool = ThreadPoolExecutor(os.cpu_count())
    result: dict[str, list[float]] = {"compute": [], "prepare_copy": [], "compress": [], "write": []}
    for _ in range(runs + 1):  # the first round warms up
        with full_matrices(adapter, [LAST]) as got:
            _sync()
            t0 = time.perf_counter()
            adapter.forward(ids)
            _sync()
            t1 = time.perf_counter()
            mats = [("weights", got.weights[LAST][0, h]) for h in range(HEADS)]
            mats += [("bias", got.bias[LAST][0, h]) for h in range(HEADS)]
            for buf, (kind, m) in zip(host, mats, strict=True):
                buf.copy_(enc.prepare(kind, m)[0], non_blocking=True)
            _sync()
            t2 = time.perf_counter()
        chunks = list(pool.map(lambda b: deflate(b.numpy().data, 1), host))
        t3 = time.perf_counter()
        writer = BiasFileWriter(tmp / "p.h5", attrs={}, n_samples=1, n_heads=HEADS, seq_len=seq_len, layers=[LAST],
                                has_bias=True, force=True)  # fmt: skip
        with writer:
            t4 = time.perf_counter()
            writer.begin_batch(np.zeros((1, seq_len), dtype=np.int32))
            for (kind, _), h, data in zip(mats, [*range(HEADS)] * 2, chunks, strict=True):
                writer.write_chunk(kind, LAST, 0, h, data)
            writer._h5.flush()
            t5 = time.perf_counter()
        for key, value in zip(result, (t1 - t0, t2 - t1, t3 - t2, t5 - t4), strict=True):
            result[key].append(value)
    enc.close()
    pool.shutdown()
    return {"T": seq_len, **{k: statistics.median(v[1:]) for k, v in result.items()},
            "compressed_mib": sum(len(c) for c in chunks) / 2**20}  # fmt: skip


def child(seq_len: int, tools: list[str], runs: int) -> None:
    import torch

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for tool in tools:
            print(json.dumps(measure(tool, seq_len, runs, Path(tmp))), flush=True)
        print(json.dumps({"phases": phases(seq_len, runs, Path(tmp))}), flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)


def table(results: list[dict]) -> str:
    out = ["| T | tool | ms/sample, median [min-max] | x floor | peak GPU GiB |", "| --- | --- | --- | --- | --- |"]
    floors = {r["T"]: statistics.median(r["times"]) for r in results if r.get("tool") == "floor" and "times" in r}
    for r in results:
        if "tool" not in r:
            continue
        if "skipped" in r:
            out.append(f"| {r['T']} | {r['tool']} | {r['skipped']} | | |")
            continue
        ms = [t * 1e3 for t in r["times"]]
        med = statistics.median(ms)
        rng = f"{med:.1f} [{min(ms):.1f}-{max(ms):.1f}]" if len(ms) > 1 else f"{med:.1f}"
        ratio = f"{med / 1e3 / floors[r['T']]:.2f}" if r["T"] in floors else "-"
        out.append(f"| {r['T']} | {r['tool']} | {rng} | {ratio} | {r['peak_gib']:.2f} |")
    out += ["", "| T | compute ms | GPU prepare + copy to host ms | compress ms | HDF5 write ms | compressed MiB |",
            "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in results:
        if "phases" in r:
            p = r["phases"]
            cells = [p["compute"], p["prepare_copy"], p["compress"], p["write"]]
            ms = " | ".join(f"{c * 1e3:.1f}" for c in cells)
            out.append(f"| {p['T']} | {ms} | {p['compressed_mib']:.0f} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    parser.add_argument("--runs", type=int, default=3, help="timed runs per cell (after one warm-up)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.seq_len[0], args.tools, args.runs)
        return
    results: list[dict] = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    for t in args.seq_len:
        cmd = [sys.executable, __file__, "--child", "--seq-len", str(t), "--runs", str(args.runs)]
        cmd += ["--tools", *args.tools]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
        for r in lines:
            print(json.dumps(r), file=sys.stderr, flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
        results += lines
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
