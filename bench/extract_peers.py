"""Final-layer attention extraction: biasviz against a bare forward pass and the tools in use today.

Every (tool, T) cell runs in a fresh process of its own virtual environment, so its peak RSS (the
process's ``ru_maxrss`` high-water mark, read in the process at the end) is its own: interpreter,
torch, the model and everything the tool allocates. Inside the process one untimed warm-up pass is
followed by ``--runs`` timed passes of one sample each (batch 1, random token ids, random weights:
nothing is downloaded). Shapes are GPT-2 small's: 12 layers, 12 heads, width 768, vocabulary 50257.

Tools (one column each):
  floor         biasviz's model, ``model(ids)`` under inference mode (fused SDPA, with logits)
  biasviz-cap   ``full_matrices(adapter, [11])`` + ``adapter.forward``: bias and weights of layer 11 held in memory
  biasviz       ``biasviz.extraction.run.extract(...)`` of layer 11 to HDF5 (default filters), per sample
  hf            transformers GPT2LMHeadModel, eager attention, ``output_attentions=True`` (all 12 layers)
  tlens         TransformerLens ``run_with_cache(names_filter='blocks.11.attn.hook_pattern')``
  nnsight       nnsight ``trace`` saving layer 11's attention weights of the same transformers model

Usage::

    .venv/bin/python bench/extract_peers.py                                  # T = 512 2048 4096
    .venv/bin/python bench/extract_peers.py --seq-len 8192 --tools biasviz --runs 1

Peers live in ``bench/.venvs/<name>`` (see BENCHMARKS.md for how they were installed); a peer whose
environment is missing or whose run fails is reported as skipped with the reason.
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
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import GIB, MIB, current_rss_bytes, fmt_range, peak_rss_bytes  # noqa: E402

LAYERS, HEADS, WIDTH, VOCAB = 12, 12, 768, 50257
LAST = LAYERS - 1
TOOLS = ["floor", "biasviz-cap", "biasviz", "hf", "tlens", "nnsight"]
VENVS = {"tlens": "tlens2", "nnsight": "nnsight"}  # the others run in the project's .venv


# -- one tool per process ---------------------------------------------------------------------------
def _ids(seq_len: int, vocab: int = VOCAB) -> object:
    import torch

    return torch.from_numpy(__import__("numpy").random.default_rng(0).integers(0, vocab, size=(1, seq_len)))


def _biasviz(seq_len: int, tool: str) -> tuple[Callable[[], object], int]:
    import torch

    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.full_matrices import full_matrices
    from biasviz.extraction.run import extract
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    torch.manual_seed(0)
    model = BiasGPTForCausalLM(BiasGPTConfig.from_preset("gpt2-small", "alibi")).eval()
    ids = _ids(seq_len)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if tool == "floor":

        def run() -> object:
            with torch.inference_mode():
                return model(ids).logits.shape

        return run, size
    adapter = BiasGPTAdapter(model, source="random")
    if tool == "biasviz-cap":

        def run() -> object:
            with full_matrices(adapter, [LAST]) as got:
                adapter.forward(ids)
                return got.weights[LAST].shape, got.bias[LAST].shape

        return run, size
    tmp = Path(tempfile.mkdtemp())

    def run() -> object:
        return extract(adapter, ids.numpy(), tmp / "x.h5", layers=-1, device="cpu", force=True, progress=False).bytes

    return run, size


def _gpt2(seq_len: int) -> object:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, vocab_size=VOCAB,
                        n_positions=max(1024, seq_len), attn_implementation="eager")  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def _hf(seq_len: int) -> tuple[Callable[[], object], int]:
    import torch

    model, ids = _gpt2(seq_len), _ids(seq_len)

    def run() -> object:
        with torch.inference_mode():
            return model(ids, output_attentions=True).attentions[LAST].shape

    return run, sum(p.numel() * p.element_size() for p in model.parameters())


def _tlens(seq_len: int) -> tuple[Callable[[], object], int]:
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=LAYERS, d_model=WIDTH, n_heads=HEADS, d_head=WIDTH // HEADS,
                                  d_mlp=4 * WIDTH, d_vocab=VOCAB, n_ctx=seq_len, act_fn="gelu_new",
                                  normalization_type="LN", positional_embedding_type="alibi", device="cpu")  # fmt: skip
    model = HookedTransformer(cfg).eval()
    ids = _ids(seq_len)
    name = f"blocks.{LAST}.attn.hook_pattern"

    def run() -> object:
        with torch.inference_mode():
            _, cache = model.run_with_cache(ids, names_filter=name)
            return cache[name].shape

    return run, sum(p.numel() * p.element_size() for p in model.parameters())


def _nnsight(seq_len: int) -> tuple[Callable[[], object], int]:
    import torch
    from nnsight import NNsight

    model, ids = _gpt2(seq_len), _ids(seq_len)
    wrapped = NNsight(model)

    def run() -> object:
        with torch.inference_mode(), wrapped.trace(ids):
            weights = wrapped.transformer.h[LAST].attn.output[1].save()  # (1, H, T, T), eager attention
        return weights.shape

    return run, sum(p.numel() * p.element_size() for p in model.parameters())


def child(tool: str, seq_len: int, runs: int) -> None:
    """Build, warm up once, time ``runs`` passes; print one JSON line."""
    import torch

    build = {"hf": _hf, "tlens": _tlens, "nnsight": _nnsight}.get(tool)
    run, model_bytes = build(seq_len) if build else _biasviz(seq_len, tool)
    rss_model = current_rss_bytes()
    shape = run()  # warm-up (first-touch allocations, lazy imports)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"tool": tool, "T": seq_len, "times": times, "peak_rss": peak_rss_bytes(),
                      "rss_model": rss_model, "model_bytes": model_bytes, "threads": torch.get_num_threads(),
                      "check": str(shape)}))  # fmt: skip


# -- the driver -------------------------------------------------------------------------------------
def python_for(tool: str) -> Path:
    venv = VENVS.get(tool)
    return (HERE / ".venvs" / venv if venv else ROOT / ".venv") / "bin" / "python"


def measure(tool: str, seq_len: int, runs: int, timeout: float) -> dict:
    py = python_for(tool)
    if not py.exists():
        return {"tool": tool, "T": seq_len, "skipped": f"no environment at {py.parent.parent}"}
    cmd = [str(py), __file__, "--child", tool, "--seq-len", str(seq_len), "--runs", str(runs)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "T": seq_len, "skipped": f"did not finish in {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        why = "killed (out of memory?)" if proc.returncode in (-9, 137) else last
        return {"tool": tool, "T": seq_len, "skipped": why[:160]}
    return json.loads(lines[-1])


def table(results: list[dict]) -> str:
    out = ["| T | tool | s/sample, median [min-max] | x floor | peak RSS GiB | x floor | peak - RSS with model, GiB |",
           "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    floors = {r["T"]: r for r in results if r["tool"] == "floor" and "times" in r}
    for r in results:
        if "skipped" in r:
            out.append(f"| {r['T']} | {r['tool']} | skipped: {r['skipped']} | | | | |")
            continue
        f = floors.get(r["T"])
        med = statistics.median(r["times"])
        tx = f"{med / statistics.median(f['times']):.2f}" if f else "-"
        mx = f"{r['peak_rss'] / f['peak_rss']:.2f}" if f else "-"
        extra = (r["peak_rss"] - r["rss_model"]) / GIB
        out.append(f"| {r['T']} | {r['tool']} | {fmt_range(r['times'])} ({len(r['times'])} runs) | {tx} | "
                   f"{r['peak_rss'] / GIB:.2f} | {mx} | {extra:.2f} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per cell (after one warm-up)")
    parser.add_argument("--long-runs", type=int, default=2, help="timed runs for T >= 4096")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per cell")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--child", choices=TOOLS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seq_len[0], args.runs)
        return
    print(f"final-layer extraction, GPT-2-small shape, batch 1, CPU threads {os.cpu_count()}; "
          f"model weights {124 * 4 * 1e6 / MIB:.0f} MiB approx.", flush=True)  # fmt: skip
    results = []
    for t in args.seq_len:
        for tool in args.tools:
            r = measure(tool, t, args.runs if t < 4096 else args.long_runs, args.timeout)
            results.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
