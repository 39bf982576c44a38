"""Every GPU table of BENCHMARKS section 4 in one call, each part bounded in time (``bench/gpu_session.sh`` runs it).

A GPU machine is lent rarely and briefly, and starts bare: this script is prepared and rehearsed on the CPU
(``--dry-run``: the same parts and tables at tiny sizes, the CUDA-only parts reported as skipped; a test of the
suite runs it), so that a lent machine spends its minutes measuring. Each part runs in a child process of its own
with a time limit: a part that hangs, runs out of memory or fails is reported in its table, and the next starts.

Parts (GPU sizes; ``--dry-run`` shrinks each to seconds on a CPU):
  cuda_tests  the suite's CUDA tests (``pytest -m cuda``), counted
  ours-T      biasviz's GPT-2-small-shape ALiBi model at T = 4096, 32768, 131072, bfloat16 and float32, against the
              flash SDPA forward of the same shape (transformers GPT-2, ``is_causal``): forward, ``extract
              --summary`` (two samples: scores, positional logits and every other summary quantity, as
              defaulted), a training step (AdamW), interleaved repeats
  schemes     KERPLE (a formula), T5 (a table of buckets) and CABLE (per-position values): forward and training
              step against flash's at T = 4096, bfloat16, with the attention routes each took
  llama       a Llama-shaped transformers model (32 heads, width 4096, bfloat16, random weights) traced with
              ``summary=True`` at 16384 against its bare forward and ``output_attentions`` (out of memory expected)
  dense       the full extract (bias and weights of the final layer to HDF5) at 1024, 4096, 16384 against its
              phases each timed alone (compute, GPU preparation and copy, compression, write): overlapped when the
              whole is near the slowest phase rather than their sum
  device_map  a transformers model split over the GPU and the CPU by a device map, ``summary=True``

Every row gives the median and minimum of its repeats and the peak memory from torch's allocator (GPU) or the
process's peak resident memory (CPU). Results land in ``--out``: ``gpu_tables.md`` (markdown), ``gpu_results.json``
(every row), ``gpu_run.log`` (each part's output).

    python bench/gpu_run.py --out /tmp/gpu            # on the GPU machine, about 7 minutes
    python bench/gpu_run.py --out /tmp/dry --dry-run  # anywhere, about a minute on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GIB = 2**30
ROW_PREFIX = "ROW "  # a child's result lines on stdout; everything else there is log


@dataclass(frozen=True)
class Sizes:
    """What each part runs at: the GPU run's sizes or the dry run's."""

    preset: str
    ours_lengths: tuple[int, ...]
    repeats: dict[int, int]
    summary_samples: int
    resolution: int
    llama: dict[str, int]
    llama_len: int
    dense_lengths: tuple[int, ...]
    device_map: dict[str, int]
    device_map_len: int
    dtypes: tuple[str, ...] = ("bfloat16", "float32")


GPU = Sizes(preset="gpt2-small", ours_lengths=(4096, 32768, 131072), repeats={4096: 3, 32768: 2, 131072: 1},
            summary_samples=2, resolution=1024,
            llama={"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 4,
                   "intermediate_size": 11008, "vocab_size": 32000},
            llama_len=16384, dense_lengths=(1024, 4096, 16384),
            device_map={"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 16,
                        "num_hidden_layers": 4, "intermediate_size": 2816, "vocab_size": 32000},
            device_map_len=4096)  # fmt: skip
DRY = Sizes(preset="tiny", ours_lengths=(64, 128, 256), repeats={64: 1, 128: 1, 256: 1}, summary_samples=2,
            resolution=32,
            llama={"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
                   "intermediate_size": 128, "vocab_size": 256},
            llama_len=128, dense_lengths=(32, 64, 128),
            device_map={"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4,
                        "intermediate_size": 128, "vocab_size": 256},
            device_map_len=64, dtypes=("float32",))  # fmt: skip


def sizes(dry: bool) -> Sizes:
    return DRY if dry else GPU


# -- the parts (each runs in a child process; every function yields its rows) ---------------------------------------


def _device(dry: bool) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not dry else "cpu"


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _reset_peak(device: str) -> int:
    import gc

    import torch

    gc.collect()
    if device != "cuda":
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _peak_gib(device: str, base: int) -> float:
    import torch

    if device == "cuda":
        return (torch.cuda.max_memory_allocated() - base) / GIB
    sys.path.insert(0, str(HERE))
    from common import peak_hwm_bytes

    return peak_hwm_bytes() / GIB


def _oom(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def measure(device: str, name: str, build: Callable[[], Callable[[], object]], repeats: int,
            **labels: Any) -> dict[str, Any]:  # fmt: skip
    """Build a tool, run it once untimed (compilation, caches), then ``repeats`` synchronised timings.

    An error becomes the row's ``status`` (``out of memory`` for the allocator's): one tool's failure is a result.
    """
    base = _reset_peak(device)
    row: dict[str, Any] = {"tool": name, **labels}
    run = None
    try:
        run = build()
        t0 = time.perf_counter()
        run()
        _sync(device)
        row["first_s"] = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            _sync(device)
            times.append(time.perf_counter() - t0)
        row["times"] = times or [row["first_s"]]
        row["status"] = "ok"
    except Exception as err:  # every failure of a tool is reported in its row, and the part goes on
        row["status"] = "out of memory" if _oom(err) else f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    run = None  # noqa: F841 - drops the tool's tensors before the peak is read and the next tool is built
    row["peak_gib"] = _peak_gib(device, base)
    _reset_peak(device)
    return row


def interleaved(device: str, tools: dict[str, Callable[[], Callable[[], object]]], repeats: int,
                **labels: Any) -> list[dict[str, Any]]:  # fmt: skip
    """The tools' repeats taken in turn (a, b, a, b, ...), each tool built once, so a machine's drift reaches all.

    A tool whose build or run fails (out of memory, say) leaves the rotation with its status; the others go on.
    Peak GPU memory per tool: what its build keeps allocated plus the most a run of it allocates on top; on a CPU
    the process's peak resident memory, shared by the tools.
    """
    rows = {name: {"tool": name, **labels, "times": []} for name in tools}
    built: dict[str, Callable[[], object]] = {}
    held: dict[str, int] = {}
    base = _reset_peak(device)

    def timed(name: str, run: Callable[[], object]) -> float | None:
        before = _allocated(device)
        t0 = time.perf_counter()
        try:
            run()
            _sync(device)
        except Exception as err:
            rows[name]["status"] = "out of memory" if _oom(err) else f"{type(err).__name__}: {str(err)[:160]}"
            built.pop(name, None)
            return None
        seconds = time.perf_counter() - t0
        if device == "cuda":
            import torch

            top = held[name] + torch.cuda.max_memory_allocated() - before
            rows[name]["peak_gib"] = max(rows[name].get("peak_gib", 0.0), top / GIB)
            torch.cuda.reset_peak_memory_stats()
        return seconds

    for name, build in tools.items():
        before = _allocated(device)
        try:
            built[name] = build()
        except Exception as err:
            rows[name]["status"] = "out of memory" if _oom(err) else f"{type(err).__name__}: {str(err)[:160]}"
            continue
        held[name] = _allocated(device) - before
        rows[name]["first_s"] = timed(name, built[name])
    for _ in range(repeats):
        for name, run in list(built.items()):
            seconds = timed(name, run)
            if seconds is not None:
                rows[name]["times"].append(seconds)
    for row in rows.values():
        row.setdefault("status", "ok")
        if device != "cuda":
            row["peak_gib"] = _peak_gib(device, base)
        if row["status"] == "ok" and not row["times"] and row.get("first_s") is not None:
            row["times"] = [row["first_s"]]
    built.clear()
    _reset_peak(device)
    return list(rows.values())


def _allocated(device: str) -> int:
    import torch

    return torch.cuda.memory_allocated() if device == "cuda" else 0


def _ids(n: int, seq_len: int, vocab: int) -> Any:
    import torch

    return torch.randint(0, vocab, (n, seq_len), generator=torch.Generator().manual_seed(0))


def _flash_of(config: Any, seq_len: int, device: str) -> Callable[[Any], Any]:
    """The floor: transformers' GPT-2 of our model's shape on SDPA (flash on a GPU), for a dtype."""

    def make(dtype: Any) -> Any:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        shape = GPT2Config(n_positions=seq_len, n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                           vocab_size=config.vocab_size, bos_token_id=0, eos_token_id=0,
                           attn_implementation="sdpa")  # fmt: skip
        return GPT2LMHeadModel(shape).to(device, dtype)

    return make


def _ours_of(config: Any, device: str) -> Callable[[Any], Any]:
    def make(dtype: Any) -> Any:
        import torch

        from biasviz.model import BiasGPTForCausalLM

        torch.manual_seed(0)
        return BiasGPTForCausalLM(config).to(device, dtype)

    return make


def _forward(make: Callable[[Any], Any], dtype: Any, ids: Any, device: str) -> Callable[[], Callable[[], object]]:
    """A tool: one window's forward without autograd."""

    def build() -> Callable[[], object]:
        import torch

        model, one = make(dtype).eval(), ids[:1].to(device)

        def run() -> object:
            with torch.inference_mode():
                return model(input_ids=one).logits.shape

        return run

    return build


def _step(make: Callable[[Any], Any], dtype: Any, ids: Any, device: str) -> Callable[[], Callable[[], object]]:
    """A tool: one window's training step (forward, backward, AdamW), dropout off in both models."""

    def build() -> Callable[[], Callable[[], object]]:
        import torch

        model, one = make(dtype).train(), ids[:1].to(device)
        for module in model.modules():  # no dropout: the same arithmetic in both models
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def run() -> object:
            loss = model(input_ids=one, labels=one).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())

        return run

    return build


def _routes() -> str:
    """The attention routes our model's calls took since the last reset (``biasviz.model.fused.routes_taken``)."""
    from biasviz.model import fused

    taken = fused.routes_taken()
    fused.forget_routes()
    return ", ".join(f"{name} x{calls}" for name, calls in taken.items()) or "none counted"


def part_ours(seq_len: int, dry: bool) -> Iterator[dict[str, Any]]:
    """Our model against the flash SDPA forward of its shape: forward, summary, training step, per dtype."""
    import torch

    import biasviz
    from biasviz.model import BiasGPTConfig

    s = sizes(dry)
    device = _device(dry)
    repeats = s.repeats[seq_len]
    config = BiasGPTConfig.from_preset(s.preset, "alibi")
    ids = _ids(s.summary_samples, seq_len, config.vocab_size)
    floor, ours = _flash_of(config, seq_len, device), _ours_of(config, device)
    for label in s.dtypes:  # the dry run takes one: bfloat16 on a CPU rehearses nothing more, slowly
        dtype = getattr(torch, label)
        rows = interleaved(device, {"flash-sdpa forward": _forward(floor, dtype, ids, device),
                                    "ours forward": _forward(ours, dtype, ids, device)},
                           repeats, part="ours", T=seq_len, dtype=label, phase="forward",
                           floor="flash-sdpa forward")  # fmt: skip
        rows[-1]["route"] = _route(device, seq_len, ours(dtype))
        yield from rows
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:

            def summary(dtype: torch.dtype = dtype, tmp: str = tmp) -> Callable[[], object]:
                model = ours(dtype).eval()

                def run() -> object:
                    return biasviz.extract(model, ids, Path(tmp) / "s.h5", summary=True, resolution=s.resolution,
                                           device=device, force=True, progress=False).bytes  # fmt: skip

                return run

            row = measure(device, "ours summary", summary, max(1, repeats - 1), part="ours", T=seq_len,
                          dtype=label, phase="summary", samples=s.summary_samples,
                          floor="flash-sdpa forward")  # fmt: skip
            if row["status"] == "ok":
                row.update(stored=_stored(Path(tmp) / "s.h5"), statistics=_statistics(Path(tmp) / "s.h5"))
            yield row
            if seq_len == min(s.ours_lengths):  # the torch path's statistics beside (fused where the kernels run)
                os.environ["BIASVIZ_STATISTICS"] = "torch"
                try:
                    row = measure(device, "ours summary, torch statistics", summary, 1, part="ours", T=seq_len,
                                  dtype=label, phase="summary", samples=s.summary_samples,
                                  floor="flash-sdpa forward")  # fmt: skip
                finally:
                    os.environ.pop("BIASVIZ_STATISTICS")
                if row["status"] == "ok":
                    row.update(stored=_stored(Path(tmp) / "s.h5"), statistics=_statistics(Path(tmp) / "s.h5"))
                yield row
        _routes()
        steps = {"flash-sdpa train step": _step(floor, dtype, ids, device),
                 "ours train step": _step(ours, dtype, ids, device)}  # fmt: skip
        rows = interleaved(device, steps, max(1, repeats - 1), part="ours", T=seq_len, dtype=label, phase="train",
                           floor="flash-sdpa train step")  # fmt: skip
        rows[-1]["route"] = _routes()
        yield from rows


SCHEME_ROWS = ("kerple-log", "t5", "cable")  # ALiBi is part ours': a formula, a table, per-position values


def part_schemes(dry: bool) -> Iterator[dict[str, Any]]:
    """Each other form of bias: our forward and training step against flash's at the first length, bfloat16 (the
    dry run: float32), with the routes they took."""
    import torch

    from biasviz.model import BiasGPTConfig

    s = sizes(dry)
    device, seq_len = _device(dry), s.ours_lengths[0]
    label = s.dtypes[0]
    dtype = getattr(torch, label)
    for scheme in SCHEME_ROWS:
        config = BiasGPTConfig.from_preset(s.preset, scheme)
        ids = _ids(1, seq_len, config.vocab_size)
        floor, ours = _flash_of(config, seq_len, device), _ours_of(config, device)
        for phase, tool in (("forward", _forward), ("train", _step)):
            _routes()
            names = {f"flash-sdpa {phase}": tool(floor, dtype, ids, device),
                     f"{scheme} {phase}": tool(ours, dtype, ids, device)}  # fmt: skip
            rows = interleaved(device, names, 2, part="schemes", T=seq_len, dtype=label, phase=phase,
                               scheme=scheme, floor=f"flash-sdpa {phase}")  # fmt: skip
            rows[-1]["route"] = _routes()
            yield from rows


def _route(device: str, seq_len: int, model: Any) -> str:
    """The kernel our forward took (``biasviz.model.fused.route``), with the reason a compiled one was refused."""
    import torch

    from biasviz.model import fused

    scheme = next(m.pos_bias for m in model.modules() if getattr(m, "pos_bias", None) is not None)
    try:
        x = torch.zeros(1, seq_len, 1, device=device)  # score_terms reads only the length of a distance bias
        chosen = fused.route(torch.device(device), seq_len, scheme.score_terms(x))
    except Exception as err:  # the route is a label: a changed internal must not cost the row
        return f"unknown ({type(err).__name__})"
    reason = fused._probe.get(device)
    return f"{chosen or 'blocked sdpa'}{f' ({reason})' if reason else ''}"


def _stored(path: Path) -> str:
    """The summary quantities of the final layer in a file, by dataset name (what the run measured)."""
    import h5py

    with h5py.File(path, "r") as f:
        layers = [k for k in f if k.startswith("layer_")]
        return ",".join(sorted(f[layers[-1]])) if layers else ""


def _statistics(path: Path) -> str:
    """Which implementation formed the final layer's statistics (its ``statistics`` attribute): fused or torch."""
    import h5py

    with h5py.File(path, "r") as f:
        layers = [k for k in f if k.startswith("layer_")]
        return str(f[layers[-1]].attrs.get("statistics", "torch")) if layers else ""


def part_llama(dry: bool) -> Iterator[dict[str, Any]]:
    """A Llama-shaped transformers model traced with a summary, against its bare forward and output_attentions."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import biasviz

    s = sizes(dry)
    device = _device(dry)
    seq_len = s.llama_len
    config = LlamaConfig(**s.llama, max_position_embeddings=seq_len, attn_implementation="sdpa")
    ids = _ids(s.summary_samples, seq_len, config.vocab_size)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    labels = {"part": "llama", "T": seq_len, "dtype": "bfloat16", "floor": "bare forward"}
    one = ids[:1].to(device)

    def bare() -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return model(input_ids=one).logits.shape

        return run

    def attentions() -> Callable[[], object]:
        def run() -> object:
            model.set_attn_implementation("eager")  # weights are returned by the eager attention only
            try:
                with torch.inference_mode():
                    return len(model(input_ids=one, output_attentions=True).attentions)
            finally:
                model.set_attn_implementation("sdpa")

        return run

    yield measure(device, "bare forward", bare, 2, phase="forward", **labels)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:

        def summary() -> Callable[[], object]:
            def run() -> object:
                return biasviz.extract(model, ids, Path(tmp) / "s.h5", summary=True, resolution=s.resolution,
                                       device=device, force=True, progress=False).bytes  # fmt: skip

            return run

        row = measure(device, "traced summary", summary, 1, phase="summary", samples=s.summary_samples, **labels)
        if row["status"] == "ok":
            row["stored"] = _stored(Path(tmp) / "s.h5")
        yield row
    yield measure(device, "output_attentions", attentions, 1, phase="forward", **labels)


def part_dense(dry: bool) -> Iterator[dict[str, Any]]:
    """The full extract of the final layer against its phases, each timed alone (CUDA only: the GPU encoder)."""
    import torch

    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.run import extract
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    s = sizes(dry)
    device = _device(dry)
    config = BiasGPTConfig.from_preset(s.preset, "alibi")
    torch.manual_seed(0)
    adapter = BiasGPTAdapter(BiasGPTForCausalLM(config).to(device).eval(), source="random")
    for seq_len in s.dense_lengths:
        ids = _ids(1, seq_len, config.vocab_size).numpy()
        labels = {"part": "dense", "T": seq_len, "dtype": "float32"}
        with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:

            def whole(tmp: str = tmp, ids: Any = ids) -> Callable[[], object]:
                return lambda: extract(adapter, ids, Path(tmp) / "x.h5", device=device, force=True,
                                       progress=False).bytes  # fmt: skip

            row = measure(device, "full extract", whole, 2, phase="extract", **labels)
            if device != "cuda":
                row["phases"] = "skipped: the GPU encoder's phases need CUDA"
                yield row
                continue
            try:
                sys.path.insert(0, str(HERE))
                from extract_gpu import phases

                row["phases"] = phases(seq_len, 2, Path(tmp))
            except Exception as err:
                row["phases"] = "out of memory" if _oom(err) else f"{type(err).__name__}: {str(err)[:160]}"
            yield row


def part_device_map(dry: bool) -> Iterator[dict[str, Any]]:
    """A transformers directory split over the GPU and the CPU (on a CPU: the CPU and the disk) by a device map."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import biasviz

    s = sizes(dry)
    device = _device(dry)
    config = LlamaConfig(**s.device_map, max_position_embeddings=s.device_map_len)
    ids = _ids(s.summary_samples, s.device_map_len, config.vocab_size)
    first = 0 if device == "cuda" else "cpu"
    rest = "cpu" if device == "cuda" else "disk"
    where = {"model.embed_tokens": first, "model.rotary_emb": first, "model.layers.0": first, "model.layers.1": first,
             "model.layers.2": rest, "model.layers.3": rest, "model.norm": rest, "lm_head": rest}  # fmt: skip
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        torch.manual_seed(0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(Path(tmp) / "llama")

        def run_map() -> Callable[[], object]:
            return lambda: biasviz.extract(Path(tmp) / "llama", ids, Path(tmp) / "s.h5", summary=True,
                                           resolution=s.resolution, device_map=where, force=True,
                                           progress=False).bytes  # fmt: skip

        yield measure(device, "device map summary", run_map, 1, part="device_map", T=s.device_map_len,
                      dtype="bfloat16", phase="summary", placement=f"layers 0-1: {first}, 2-3: {rest}")  # fmt: skip


def part_cuda_tests(dry: bool) -> Iterator[dict[str, Any]]:
    """The suite's CUDA tests, counted from pytest's JUnit report."""
    import xml.etree.ElementTree as ET

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
               str(ROOT / "tests")]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        print(done.stdout[-6000:], done.stderr[-2000:], flush=True)
        if not report.exists():
            yield {"part": "cuda_tests", "tool": "pytest -m cuda", "status": f"no report (exit {done.returncode})"}
            return
        suite = ET.parse(report).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                  if case.find("failure") is not None or case.find("error") is not None]  # fmt: skip
        yield {"part": "cuda_tests", "tool": "pytest -m cuda", "status": "ok" if done.returncode == 0 else "failed",
               "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"], **counts,
               "failed": failed}  # fmt: skip


def part_kernels(dry: bool) -> Iterator[dict[str, Any]]:
    """The fused statistics kernels alone (K1, the row log-sum-exp; K2, every accumulator) against the flash forward of
    one attention layer of the same shape (GPT-2-small's 12 x 64, N = 2, bf16 q and k), and up to T = 32768 with FIRE's
    MLP, a softcap and sink columns, and CABLE's bias of each sample's own; first, a check that fails the
    part where the fused statistics differ from the torch path's summary of our model (ALiBi, RoPE, FIRE, CABLE), of
    traced SDPA layers with ALiBi, BLOOM's m·j or a bias of each cell in their float mask, of Gemma 2's softcapped
    and GPT-OSS's sink layers, and of BLOOM beside padding (T = 2048, N = 3). In a dry run: tiny sizes through Triton's
    interpreter."""
    import torch

    from biasviz.summaries import kernels
    from biasviz.summaries.kernels.biases import MlpBias, SampleEnds

    device = _device(dry)
    if kernels.unavailable(torch.device(device)):
        yield {"tool": "fused kernels", "status": f"skipped: {kernels.unavailable(torch.device(device))}"}
        return
    heads, hd, n = (2, 16, 2) if dry else (12, 64, 2)
    dtype = torch.float32 if dry else torch.bfloat16
    # the fused-vs-torch check first: what the part's limit may cut is the longest timing, not a check
    yield from _fused_against_torch(device, 32 if dry else 2048, 2 if dry else 12)
    for seq_len in (32,) if dry else (4096, 32768, 131072):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(n, heads, seq_len, hd, generator=gen).to(device, dtype) for _ in range(3))
        slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)
        table = (-slopes[:, None] * torch.arange(seq_len)[None]).to(device)  # ALiBi's f(d)
        scale = hd**-0.5
        block = max(1, seq_len // 1024)
        lse = kernels.row_lse(q, k, table, scale)

        def flash(q: Any = q, k: Any = k, v: Any = v) -> Callable[[], object]:
            return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        def k1(q: Any = q, k: Any = k, table: Any = table, scale: float = scale) -> Callable[[], object]:
            return lambda: kernels.row_lse(q, k, table, scale)

        def k2(q: Any = q, k: Any = k, table: Any = table, lse: Any = lse, scale: float = scale,
               block: int = block) -> Callable[[], object]:  # fmt: skip
            return lambda: kernels.tile_sums(q, k, table, lse, scale, block)

        tools = {"flash-sdpa layer forward": flash, "K1 row lse": k1, "K2 tile statistics": k2}
        if seq_len <= 32768:  # what the other kinds of call cost beside: FIRE's MLP in each tile (32 hidden units),
            # a softcap and sink columns (K1 the sinks, K2 the cap)
            mlp = MlpBias(torch.log1p(0.1 * torch.arange(seq_len, dtype=torch.float32)),
                                  torch.log1p(0.1 * torch.arange(seq_len, dtype=torch.float32).clamp(min=512.0)),
                                  *(torch.randn(*shape, generator=gen) for shape in ((32,), (32,), (heads, 32),
                                                                                     (heads,))))  # fmt: skip
            sinks = torch.randn(n, seq_len, heads, generator=gen).to(device)
            lse_capped = kernels.row_lse(q, k, None, scale, softcap=50.0, sinks=sinks)

            def k1_fire(q: Any = q, k: Any = k, mlp: Any = mlp, scale: float = scale) -> Callable[[], object]:
                return lambda: kernels.row_lse(q, k, mlp, scale)

            def k2_fire(q: Any = q, k: Any = k, mlp: Any = mlp, lse: Any = lse, scale: float = scale,
                        block: int = block) -> Callable[[], object]:  # fmt: skip
                return lambda: kernels.tile_sums(q, k, mlp, lse, scale, block)

            def k1_sinks(q: Any = q, k: Any = k, sinks: Any = sinks, scale: float = scale) -> Callable[[], object]:
                return lambda: kernels.row_lse(q, k, None, scale, softcap=50.0, sinks=sinks)

            def k2_capped(q: Any = q, k: Any = k, lse: Any = lse_capped, scale: float = scale,
                          block: int = block) -> Callable[[], object]:  # fmt: skip
                return lambda: kernels.tile_sums(q, k, None, lse, scale, block, softcap=50.0)

            # CABLE's bias, each sample's own e_a(i) - e_a(j): two values a position
            ends = SampleEnds(-torch.nn.functional.softplus(torch.randn(n, heads, seq_len, generator=gen)).cumsum(-1))
            lse_ends = kernels.row_lse(q, k, ends, scale)

            def k1_ends(q: Any = q, k: Any = k, ends: Any = ends, scale: float = scale) -> Callable[[], object]:
                return lambda: kernels.row_lse(q, k, ends, scale)

            def k2_ends(q: Any = q, k: Any = k, ends: Any = ends, lse: Any = lse_ends, scale: float = scale,
                        block: int = block) -> Callable[[], object]:  # fmt: skip
                return lambda: kernels.tile_sums(q, k, ends, lse, scale, block)

            tools.update({"K1 row lse, FIRE's MLP": k1_fire, "K2 tile statistics, FIRE's MLP": k2_fire,
                          "K1 row lse, softcap and sinks": k1_sinks, "K2 tile statistics, softcap": k2_capped,
                          "K1 row lse, CABLE's ends": k1_ends, "K2 and K3 tile statistics, CABLE's ends": k2_ends})
        yield from interleaved(device, tools, 0 if dry else 1 if seq_len > 32768 else 3, part="kernels", T=seq_len,
                               dtype=str(dtype).removeprefix("torch."), phase="kernels",
                               floor="flash-sdpa layer forward", batch=n)  # fmt: skip (all N in each call)
        del q, k, v, lse
        tools.clear()


def _fused_against_torch(device: str, seq_len: int, heads: int) -> Iterator[dict[str, Any]]:
    """One row per scheme: the same summary through the public call with the torch path's statistics and with the fused
    kernels' (``BIASVIZ_STATISTICS``), file against file; the largest difference over every dataset relative to its
    largest value (an SE's: or to a hundredth of its mean's), and which path each layer took. The status says
    ``differs`` past 1e-3, or names a path not taken."""
    import h5py
    import numpy as np
    import torch

    import biasviz
    from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM

    def datasets(path: Path) -> tuple[dict[str, Any], str]:
        with h5py.File(path) as f:
            (name,) = (g for g in f if g.startswith("layer_"))
            g = f[name]
            return {name: g[name][()] for name in g}, str(g.attrs.get("statistics", "torch"))

    for scheme in ("alibi", "rope", "fire", "cable", "traced alibi", "traced m·j", "traced cells", "gemma2 softcap",
                   "gpt-oss sinks", "bloom padded"):
        torch.manual_seed(0)
        options: dict[str, Any] = {}
        if scheme in ("gemma2 softcap", "gpt-oss sinks"):  # a softmax over cap·tanh(s / cap), or beside sink columns
            model, layers = _softmax_extras(scheme.split()[0], heads).to(device), -1
        elif scheme == "bloom padded":  # its row of keys starts after each sample's own padding: it differs by sample
            model, layers = _padded_bloom(heads, seq_len, device)
            options = {"forward": model.forward_padded}
        elif scheme.startswith("traced"):  # ALiBi in a traced SDPA call's float mask: the kernels take the table kept,
            # of j - i, or (BLOOM's m·j) the row of keys kept
            model = _traced_alibi(heads, keys=scheme.endswith("m·j"), cells=scheme.endswith("cells"))
            model, layers = model.to(device), -1
        else:
            # (a dry run's 2 heads: Triton's interpreter runs a program at a time)
            config = BiasGPTConfig(scheme=scheme, n_layer=2, n_head=heads, n_embd=16 * heads, n_positions=seq_len,
                                   vocab_size=256)  # fmt: skip
            model, layers = BiasGPTForCausalLM(config).eval().to(device), [1]
        ids = _ids(3, seq_len, 256)
        row: dict[str, Any] = {"tool": f"fused vs torch, {scheme}", "part": "kernels", "T": seq_len, "samples": 3}
        try:
            with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
                files = {}
                for mode in ("torch", "fused"):
                    os.environ["BIASVIZ_STATISTICS"] = mode
                    biasviz.extract(model, ids, Path(tmp) / f"{mode}.h5", layers=layers, summary=True,
                                    resolution=seq_len // 8, device=device, progress=False, **options)  # fmt: skip
                    files[mode] = datasets(Path(tmp) / f"{mode}.h5")
                os.environ.pop("BIASVIZ_STATISTICS")
            (want, took_torch), (got, took_fused) = files["torch"], files["fused"]
            worst = 0.0
            def largest(x: Any) -> float:
                x = np.asarray(x, dtype=np.float64)
                return float(np.nanmax(np.abs(x))) if np.isfinite(x).any() else 0.0

            for name, value in want.items():
                fields = value.dtype.names or (None,)
                for field in fields:
                    a = np.asarray(value if field is None else value[field], dtype=np.float64)
                    b = np.asarray(got[name] if field is None else got[name][field], dtype=np.float64)
                    # an SE is a spread of means, rounded as the means are: measured against a hundredth of them
                    base = want.get(name.removesuffix("_se")) if name.endswith("_se") and field is None else None
                    top = max(largest(a), 0.01 * largest(base) if base is not None else 0.0) or 1.0
                    if name.endswith("diagnostics"):  # a ratio to the spread, its 0 reached by cancellation (CABLE's
                        top = max(top, 1.0)  # bias is exactly s_i - s_j: a separability residual of float64 rounding)
                    worst = max(worst, float(np.nanmax(np.abs(b - a), initial=0.0)) / top)
            row.update(largest_difference=worst, statistics=f"{took_torch} / {took_fused}",
                       missing=",".join(sorted(set(want) ^ set(got))))  # fmt: skip
            row["status"] = ("ok" if worst <= 1e-3 and took_fused == "fused" and not row["missing"]
                             else f"differs: {worst:.2e} of the largest value, paths {row['statistics']}, "
                                  f"datasets not in both: {row['missing'] or 'none'}")  # fmt: skip
        except Exception as err:  # a failure is a result of the part
            row["status"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        yield row


def _padded_bloom(heads: int, seq_len: int, device: str) -> tuple[Any, int]:
    """transformers' BLOOM (1 layer, 16 dims a head, random weights) and, as ``forward_padded``, its forward with
    each of 3 samples padded on the left by 0, T / 8 and T / 3 tokens (its ALiBi positions start after them)."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(vocab_size=256, hidden_size=16 * heads, n_layer=1, n_head=heads)).eval()
    model = model.to(device)
    pad = torch.ones(3, seq_len, dtype=torch.long, device=device)
    pad[1, : seq_len // 8] = 0
    pad[2, : seq_len // 3] = 0
    rows = {tuple(r.tolist()): a for a, r in enumerate(_ids(3, seq_len, 256))}

    def forward_padded(batch: Any) -> Any:
        return model(batch, attention_mask=pad[[rows[tuple(r.tolist())] for r in batch.cpu()]])

    model.forward_padded = forward_padded
    return model, -1


def _softmax_extras(name: str, heads: int) -> Any:
    """One eager layer of transformers' Gemma 2 (its scores capped at 1.0, so that the cap bends them) or GPT-OSS (a
    learned sink column a head, drawn to take a share), 16 dims a head, a sliding window of 128 keys, random weights."""
    import torch

    if name == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM

        config = Gemma2Config(vocab_size=256, hidden_size=16 * heads, intermediate_size=32 * heads, num_hidden_layers=1,
                              num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=16,
                              attn_logit_softcapping=1.0, sliding_window=128)  # fmt: skip
        return Gemma2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(hidden_size=16 * heads, num_attention_heads=heads, num_key_value_heads=heads // 2,
                          head_dim=16, num_hidden_layers=1, intermediate_size=32, vocab_size=256, num_local_experts=2,
                          num_experts_per_tok=1, sliding_window=128, max_position_embeddings=1 << 17,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          attn_implementation="eager")  # fmt: skip
    model = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.sinks.normal_(std=2.0)
    return model


def _traced_alibi(heads: int, keys: bool = False, cells: bool = False) -> Any:
    """One SDPA layer over an embedding (16 dims a head) that adds -m_h·(i - j) in its float mask, -inf after the
    query, as research code writes ALiBi: a module biasviz traces, its bias kept as a table of j - i; ``keys``: m_h·j,
    as BLOOM writes it, kept as a row of keys; ``cells``: -m_h·log(1 + i - j)·(1 + i / T), a bias of the query as well
    as of the distance (FIRE's interpolation, as research code may write one), kept cell by cell."""
    import torch

    class TracedAlibi(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(256, 16 * heads)
            self.qkv = torch.nn.Linear(16 * heads, 48 * heads)
            self.register_buffer("slopes", 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads))

        def forward(self, ids: Any) -> Any:
            b, t = ids.shape
            q, k, v = (z.view(b, t, heads, 16).transpose(1, 2) for z in self.qkv(self.embed(ids)).chunk(3, -1))
            i = torch.arange(t, device=ids.device)
            d = (i[None, :] + 0 * i[:, None]) if keys else -(i[:, None] - i[None, :])
            if cells:
                d = -torch.log1p((i[:, None] - i[None, :]).clamp(min=0).float()) * (1 + i[:, None] / t)
            bias = (self.slopes[:, None, None] * d).masked_fill(i[None, :] > i[:, None], float("-inf"))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return TracedAlibi().eval()


@dataclass(frozen=True)
class Part:
    """One bounded part: its rows' function, its time limit on the GPU and in a dry run, and whether it needs CUDA."""

    rows: Callable[[bool], Iterator[dict[str, Any]]]
    limit_s: float
    dry_limit_s: float
    cuda_only: bool = False


def parts() -> dict[str, Part]:
    """The parts in the order they run (the cheap and most telling first); the GPU limits sum to 480 s, the whole
    run's bound in gpu_session.sh (sized by the run of 2026-11-28 on an H200: the CUDA tests took 43 s, ours at 4096
    65 s, the Llama part 38 s, the device map 19 s). The kernels part compiles about 17 variants of K1, K2 and K3 for
    its check (T = 2048, N = 3), and 9 for each of its two timed lengths: each a few seconds (2 s a variant for
    sm_90 with Triton's ptxas on this project's 2-core CPU, ``bench/compile_kernels.py``), so it has 100 s."""
    table: dict[str, Part] = {"cuda_tests": Part(part_cuda_tests, 45, 60, cuda_only=True)}
    for seq_len, limit in zip(GPU.ours_lengths, (70, 90, 45), strict=True):
        table[f"ours-{seq_len}"] = Part(lambda dry, t=seq_len: part_ours(t if not dry else _dry_len(t), dry),
                                        limit, 120)  # fmt: skip
    table["kernels"] = Part(part_kernels, 100, 120)
    table["schemes"] = Part(part_schemes, 30, 120)
    table["llama"] = Part(part_llama, 50, 90)
    table["dense"] = Part(part_dense, 30, 60)
    table["device_map"] = Part(part_device_map, 20, 60)
    return table


def _dry_len(gpu_len: int) -> int:
    return DRY.ours_lengths[GPU.ours_lengths.index(gpu_len)]


# -- the runner: one child per part, its time bounded ----------------------------------------------------------------


def run_part(name: str, dry: bool, limit_s: float, log: Any) -> list[dict[str, Any]]:
    """Run one part in a child process for at most ``limit_s`` seconds; its rows, or one row that says what ended it.

    Rows come back as lines on the child's stdout, so the rows of a part killed at its limit are kept.
    """
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", name, *(["--dry-run"] if dry else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           **({"TRITON_INTERPRET": "1"} if dry else {}),  # a dry run's kernels through Triton's interpreter
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the part and whatever it started (pytest's children)
            proc.wait()
            code = None
        out.seek(0)
        text = out.read()
    seconds = time.perf_counter() - t0
    log.write(f"## {name} ({seconds:.1f} s, exit {code})\n{text}\n")
    log.flush()
    rows = [json.loads(line[len(ROW_PREFIX):]) for line in text.splitlines() if line.startswith(ROW_PREFIX)]
    if code is None:
        rows.append({"part": name, "tool": "(part)", "status": f"timed out after {limit_s:.0f} s: rows above are "
                     "those it finished"})  # fmt: skip
    elif code != 0:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit {code}"]
        rows.append({"part": name, "tool": "(part)", "status": f"failed (exit {code}): {last[0][:200]}"})
    for row in rows:
        row.setdefault("part", name)
        row["part_s"] = round(seconds, 1)
    return rows


def child(name: str, dry: bool) -> None:
    for row in parts()[name].rows(dry):
        print(ROW_PREFIX + json.dumps(row), flush=True)


def machine(dry: bool) -> dict[str, Any]:
    """What the tables were measured on."""
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "dry_run": dry,
                            "cpus": os.cpu_count(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                            "load": round(os.getloadavg()[0], 2)}  # fmt: skip
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def ratio_to_floor(row: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """A row's median time over its floor's (the row named by ``floor`` at the same part, T and dtype), per sample."""
    if not row.get("times") or not row.get("floor"):
        return None
    for other in rows:
        if (other.get("tool") == row["floor"] and other.get("times")
                and all(other.get(k) == row.get(k) for k in ("part", "T", "dtype", "scheme"))):  # fmt: skip
            per = row.get("samples", 1)  # a summary of N samples against N forwards of one
            return statistics.median(row["times"]) / (per * statistics.median(other["times"]))
    return None


def tables(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """The markdown tables: one per part kind, every row with its status."""
    head = ", ".join(f"{k} {v}" for k, v in info.items())
    memory = "torch's allocator, GPU" if "gpu" in info else "the process's peak resident memory, CPU"
    out = [f"Measured on: {head}", "", f"Peak GiB: {memory}. x floor: median over the floor's median, per sample.", ""]
    timed = [r for r in rows if r.get("part", "").startswith(("ours", "schemes", "llama", "device_map", "kernels"))]
    out += ["| part | T | dtype | tool | s, median [min] | x floor | peak GiB | route | status |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in timed:
        ratio = ratio_to_floor(r, rows)
        out.append(f"| {r.get('part')} | {r.get('T', '')} | {r.get('dtype', '')} | {r.get('tool')} | {_times(r)} | "
                   f"{'' if ratio is None else f'{ratio:.2f}'} | {_gib(r)} | {r.get('route', '')} | "
                   f"{_status(r)} |")  # fmt: skip
    out += ["", "| T | full extract s, median [min] | compute s | prepare + copy s | compress s | write s | "
            "x slowest phase | x sum of phases | status |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r.get("part") == "dense"):
        p = r.get("phases")
        if isinstance(p, dict) and r.get("times"):
            cells = [p["compute"], p["prepare_copy"], p["compress"], p["write"]]
            whole = statistics.median(r["times"])
            extra = " | ".join(f"{c:.3f}" for c in cells) + f" | {whole / max(cells):.2f} | {whole / sum(cells):.2f}"
        else:
            extra = " | ".join([str(p or "")] + [""] * 5)
        out.append(f"| {r.get('T', '')} | {_times(r)} | {extra} | {r.get('status', '')} |")
    out += ["", "| CUDA tests | passed | failed | errors | skipped | status |", "| --- | --- | --- | --- | --- | --- |"]
    for r in (r for r in rows if r.get("part") == "cuda_tests"):
        out.append(f"| pytest -m cuda | {r.get('passed', '')} | {r.get('failures', '')} | {r.get('errors', '')} | "
                   f"{r.get('skipped', '')} | {r.get('status', '')} |")  # fmt: skip
        out += [f"| {name} | | failed | | | |" for name in r.get("failed", [])]
    return "\n".join(out) + "\n"


def _times(r: dict[str, Any]) -> str:
    t = r.get("times")
    if not t:
        return ""
    return f"{statistics.median(t):.3f} [{min(t):.3f}]" if len(t) > 1 else f"{t[0]:.3f}"


def _status(r: dict[str, Any]) -> str:
    route = f"; kernel: {r['route']}" if r.get("route") else ""
    return f"{r.get('status', '')}{route}"


def _gib(r: dict[str, Any]) -> str:
    return f"{r['peak_gib']:.2f}" if isinstance(r.get("peak_gib"), float) else ""


def run(out: Path, dry: bool, only: list[str] | None = None, scale: float = 1.0,
        inline: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Every part (or ``only`` these) in turn, each within its limit times ``scale``; the files written to ``out``.

    ``inline``: the parts run in this process, unbounded (the test suite's dry run, where a child per part would
    import torch again for each).
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not dry
    info = machine(dry)
    rows: list[dict[str, Any]] = []
    with open(out / "gpu_run.log", "w") as log:
        for name, part in parts().items():
            if only and name not in only:
                continue
            if part.cuda_only and not cuda:
                rows.append({"part": name, "tool": "(part)", "status": "skipped: no CUDA device"})
                continue
            limit = (part.dry_limit_s if dry else part.limit_s) * scale
            print(f"{name}: up to {limit:.0f} s", file=sys.stderr, flush=True)
            if inline:
                rows += [{"part": name, **row} for row in part.rows(dry)]
            else:
                rows += run_part(name, dry, limit, log)
            (out / "gpu_results.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
            (out / "gpu_tables.md").write_text(tables(rows, info))
    (out / "gpu_results.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
    (out / "gpu_tables.md").write_text(tables(rows, info))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_tables.md, gpu_results.json and gpu_run.log")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: the CUDA parts skipped")
    parser.add_argument("--parts", nargs="+", choices=list(parts()), help="run only these parts")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every part's time limit")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # a child: one part's rows on stdout
    args = parser.parse_args(argv)
    if args.part:
        child(args.part, args.dry_run)
        return
    if args.out is None:
        parser.error("--out is required")
    rows = run(args.out, args.dry_run, args.parts, args.scale)
    print((args.out / "gpu_tables.md").read_text())
    bad = [r for r in rows if r.get("status", "ok") not in ("ok",) and not str(r.get("status")).startswith("skipped")]
    print(f"{len(rows)} rows, {len(bad)} not ok; files in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
