"""Training a GPT-2 variant offline: local corpus, locally built tokenizer, reproducible batches."""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biasviz.common.atomic import replacing, write_new
from biasviz.common.checks import check_learning_rate, check_seed
from biasviz.common.errors import BiasvizError, os_error_message, underlying_os_error
from biasviz.common.exclusive import writing_alone
from biasviz.common.memory import attention_bytes, check_fits
from biasviz.common.names import display_name, utf8_data
from biasviz.common.processes import World, process_group
from biasviz.common.progress import Progress
from biasviz.data import load_corpus, load_tokenizer, save_tokenizer
from biasviz.data.token_cache import tokenized
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, fused
from biasviz.training.checkpoints import check_output, checkpoint_dir, share_mode

TRAINING_FILE = "training.json"


@dataclass
class TrainSettings:
    """Everything that determines a training run (saved beside the checkpoint as training.json)."""

    scheme: str
    preset: str = "tiny"
    steps: int = 300
    seq_len: int = 128
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.1
    seed: int = 0
    corpus: str | None = None
    tokenizer: str | None = None
    max_corpus_bytes: int = 8_000_000
    scheme_options: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    precision: str = "auto"  # auto: bfloat16 autocast on CUDA, float32 elsewhere; or float32 / bfloat16
    compile: bool = False  # torch.compile the model (CUDA: faster steps after a compilation of tens of seconds)
    save_every: int = 0  # > 0: also write OUT/checkpoint-STEP/ at 0, every so many steps and at the last (sweeps)


@dataclass
class TrainResult:
    out_dir: Path
    losses: list[float]
    seconds: float
    tokens: int
    step_seconds: list[float] = field(default_factory=list)  # per optimiser step (the loss is read every step)

    @property
    def steady_tokens_per_s(self) -> float:
        """Throughput of the second half of the steps: warm-up and compilation excluded."""
        tail = self.step_seconds[len(self.step_seconds) // 2 :]
        return self.tokens / len(self.step_seconds) * len(tail) / max(sum(tail), 1e-9) if tail else 0.0


def _lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up then cosine decay to 10%."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass: bfloat16 autocast on CUDA unless float32 is asked for.

    The parameters, gradients and optimiser state stay float32 (no loss scaling is needed with bfloat16);
    the checkpoint is written in float32 either way.
    """
    choice = precision.strip().lower()
    if choice not in ("auto", "float32", "bfloat16"):
        raise BiasvizError(f"unknown precision '{precision}'; use auto, float32 or bfloat16")
    if choice == "float32" or (choice == "auto" and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _optimizer(model: torch.nn.Module, s: TrainSettings) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.95))


def train(settings: TrainSettings, out_dir: str | Path, *, force: bool = False, progress: bool = True) -> TrainResult:
    """Train a model and write a checkpoint directory loadable by ``from_pretrained``.

    The directory holds ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
    ``training.json``. It is assembled under a temporary name and moved into place at the end,
    so an interrupted run leaves no half-written checkpoint. With ``save_every`` it also holds
    ``checkpoint-STEP/`` directories. Under torchrun the processes train together (DDP) and process 0
    alone writes.
    """
    s = settings
    out = Path(out_dir)
    base = check_settings(s)
    check_output(out, force)
    with process_group(s.device) as (w, device):  # under torchrun: joined here, unless the caller has (the CLI)
        return _train_and_write(s, base, out, device, w, progress)


def _train_and_write(s: TrainSettings, base: BiasGPTConfig, out: Path, device: torch.device, w: World,
                     progress: bool) -> TrainResult:  # fmt: skip
    """Process 0 trains into a temporary folder and moves it to ``out``; the others train alongside it."""
    check_fits(_training_bytes(base, s), f"training {s.batch_size} x {s.seq_len} tokens per step",
               "use a smaller --batch-size or a shorter --seq-len", device)  # fmt: skip
    if not w.main:  # the other processes train alongside process 0 and write nothing
        return _train(s, base, device, None, progress, w)
    try:
        # one process writes OUT (another fails at once); a whole checkpoint or none
        with writing_alone(out), replacing(out) as tmp:
            tmp.mkdir(parents=True)  # an unwritable place fails here, before the training
            result = _train(s, base, device, tmp, progress, w)
            share_mode(tmp)
    except BiasvizError:
        raise
    except Exception as exc:  # safetensors reports a full disk as its own error
        cause = underlying_os_error(exc)
        if cause is None:
            raise
        raise BiasvizError(os_error_message(cause, out)) from exc
    result.out_dir = out
    return result


def check_settings(s: TrainSettings) -> BiasGPTConfig:
    """Every setting checked before any work; returns the preset's config (its scheme options checked too)."""
    if s.steps < 1 or s.seq_len < 2 or s.batch_size < 1:
        raise BiasvizError("--steps and --batch-size must be >= 1 and --seq-len >= 2")
    if s.save_every < 0:
        raise BiasvizError(f"--save-every must be 0 (off) or a number of steps, not {s.save_every}")
    check_learning_rate(s.lr)
    check_seed(s.seed)
    return BiasGPTConfig.from_preset(s.preset, s.scheme, scheme_options=s.scheme_options)


def _training_bytes(config: BiasGPTConfig, s: TrainSettings) -> int:
    """A lower bound of a step's memory: each layer keeps its (B, H, T, T) attention for the backward pass."""
    return config.n_layer * attention_bytes(s.batch_size, config.n_head, s.seq_len)


def _train(s: TrainSettings, base: BiasGPTConfig, device: torch.device, tmp: Path | None, progress: bool,
           w: World) -> TrainResult:  # fmt: skip
    """The training itself; process 0 writes the checkpoint's files into ``tmp`` (None in the others)."""
    torch.manual_seed(s.seed)  # the same initial weights in every process (DDP also broadcasts rank 0's)
    rng = np.random.default_rng(s.seed)
    corpus = load_corpus(s.corpus, max_bytes=s.max_corpus_bytes)
    # a small corpus can yield fewer merges than asked for: the model takes the tokenizer's true size
    given = load_tokenizer(s.tokenizer) if s.tokenizer else None
    tok, tokens = tokenized(corpus.documents, base.vocab_size, given)  # built, or read back from the cache
    vocab_size = tok.get_vocab_size()
    if len(tokens) <= s.seq_len + 1:
        raise BiasvizError(f"the corpus has only {len(tokens)} tokens; need more than --seq-len {s.seq_len}")
    config = BiasGPTConfig.from_preset(
        s.preset, s.scheme, scheme_options=s.scheme_options, vocab_size=vocab_size,
        n_positions=max(base.n_positions, s.seq_len),
    )  # fmt: skip
    model = BiasGPTForCausalLM(config).to(device)
    model.train()
    opt = _optimizer(model, s)
    autocast = _autocast(s.precision, device)
    step_model = _data_parallel(model, device) if w.size > 1 else model
    step_model = torch.compile(step_model) if s.compile else step_model
    data = torch.from_numpy(tokens.astype(np.int64))
    losses: list[float] = []
    step_seconds: list[float] = []

    def save(directory: Path, step: int, seconds: float) -> None:
        """config.json, model.safetensors, tokenizer.json and training.json: loadable by ``--model``."""
        model.save_pretrained(directory)
        save_tokenizer(tok, directory)
        settings = asdict(s)  # the corpus's name recorded as valid UTF-8 text (common.names)
        if isinstance(settings.get("corpus"), str):
            settings["corpus"] = display_name(settings["corpus"])
        record = {
            "settings": settings, "device": str(device), "processes": w.size, "step": step,
            "corpus_source": display_name(corpus.source), "corpus_chars": corpus.n_bytes,
            "corpus_tokens": int(len(tokens)),
            "seconds": round(seconds, 2), "final_loss": float(np.mean(losses[-10:])) if losses else None,
            "torch_version": torch.__version__,
            "autocast": "bfloat16" if isinstance(autocast, torch.autocast) else "none",
            "attention_routes": fused.routes_taken(),  # route -> attention calls (model.fused.ROUTES)
        }  # fmt: skip
        write_new(directory / TRAINING_FILE, json.dumps(utf8_data(record), indent=2))

    saving = tmp is not None and s.save_every > 0
    fused.forget_routes()  # what this run's steps take, recorded with each checkpoint
    if saving:
        save(checkpoint_dir(tmp, 0), 0, 0.0)  # the initialisation, where every sweep starts
    start = last = time.perf_counter()
    # a bar on a terminal, a heartbeat line every few seconds in a log (as extract), nothing with --quiet
    bar = Progress(s.steps, desc=f"train {config.scheme}", unit="step", show=None if progress and w.main else False)
    for step in range(s.steps):
        # one global batch of batch_size x processes windows, drawn alike everywhere; each process takes its part
        starts = rng.integers(0, len(tokens) - s.seq_len, size=s.batch_size * w.size)
        mine = starts[w.rank * s.batch_size : (w.rank + 1) * s.batch_size]
        batch = torch.stack([data[i : i + s.seq_len] for i in mine]).to(device)  # (B, T)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, s)
        with autocast:
            loss = step_model(batch, labels=batch).loss
        if not torch.isfinite(loss):
            raise BiasvizError(f"training diverged at step {step} (loss {loss.item()}); lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()  # under DDP the gradients are averaged over the processes here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for scheme in model.schemes():
            scheme.constrain_()
        losses.append(_mean_over_processes(loss.detach()))
        now = time.perf_counter()
        step_seconds.append(now - last)
        last = now
        if step % 10 == 0:
            bar.set_phase(f"train {config.scheme}, loss {losses[-1]:.3f}")
        bar.update()
        done = step + 1
        if saving and (done % s.save_every == 0 or done == s.steps):
            save(checkpoint_dir(tmp, done), done, now - start)
    bar.close()
    seconds = time.perf_counter() - start
    if tmp is not None:
        model.eval().to("cpu")
        save(tmp, s.steps, seconds)
    return TrainResult(tmp or Path(), losses, seconds, s.steps * s.batch_size * s.seq_len * w.size, step_seconds)


def _data_parallel(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel over the process group torchrun's processes joined (:func:`train`)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def _mean_over_processes(loss: torch.Tensor) -> float:
    """The loss averaged over the processes (the loss of the whole global batch); a plain float in one process."""
    import torch.distributed as dist

    if dist.is_initialized():
        loss = loss.clone()
        dist.all_reduce(loss)
        loss /= dist.get_world_size()
    return loss.item()
