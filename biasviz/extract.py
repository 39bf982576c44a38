"""Capture per-head biases and attention weights with forward hooks and stream them into HDF5.

Memory stays bounded by one batch whatever the number of samples: each batch is written as soon as
it is captured, and only the captured layers' tensors are kept. On CUDA the captured tensors are
copied into pinned host buffers on a side stream, so batch k is copied and written while the GPU
computes batch k + 1; nothing else leaves the GPU (the forward pass stops after the last captured
layer, so there are no logits at all).
"""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biasviz.adapters.base import Captured, ModelAdapter
from biasviz.devices import resolve_device
from biasviz.errors import BiasvizError
from biasviz.store import BiasFileWriter


@dataclass
class ExtractResult:
    path: Path
    samples: int
    seq_len: int
    layers: list[int]
    has_bias: bool
    seconds: float
    bytes: int


@dataclass
class _Batch:
    """One captured batch on its way to the file: host tensors plus an event to wait for (CUDA)."""

    input_ids: np.ndarray  # (b, T)
    weights: dict[int, torch.Tensor]  # (b, H, T, T)
    bias: dict[int, torch.Tensor]  # (1 or b, H, T, T)
    ready: torch.cuda.Event | None = None

    def wait(self) -> _Batch:
        if self.ready is not None:
            self.ready.synchronize()
        return self


class _HostCopy:
    """Moves captured tensors to the host; on CPU they are already there (no copy)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.slots: list[dict[tuple[str, int], torch.Tensor]] = [{}, {}]  # double buffering
            self.turn = 0

    def start(self, ids: np.ndarray, got: Captured) -> _Batch:
        if not self.cuda:
            return _Batch(ids, dict(got.weights), dict(got.bias))
        slot = self.slots[self.turn]
        self.turn ^= 1  # slot k % 2 is reused two batches later, after batch k has been written
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))  # the tensors are computed
        out: dict[str, dict[int, torch.Tensor]] = {"weights": {}, "bias": {}}
        with torch.cuda.stream(self.stream):
            for kind, tensors in (("weights", got.weights), ("bias", got.bias)):
                for layer, t in tensors.items():
                    if t.device.type != "cuda":  # an adapter that already moved it
                        out[kind][layer] = t
                        continue
                    buf = slot.get((kind, layer))
                    if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                        slot[(kind, layer)] = buf
                    buf.copy_(t, non_blocking=True)
                    t.record_stream(self.stream)  # keep its GPU memory alive until the copy is done
                    out[kind][layer] = buf
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return _Batch(ids, out["weights"], out["bias"], ready)


def _scheme_flag(adapter: ModelAdapter, name: str, default: bool) -> bool:
    value = getattr(adapter, name, None)
    if value is not None:
        return bool(value)
    from biasviz.schemes import get_scheme

    try:
        return bool(getattr(get_scheme(adapter.scheme), name))
    except BiasvizError:
        return default


def _device_label(device: torch.device) -> tuple[str, str]:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index}", torch.cuda.get_device_name(index)
    return "cpu", platform.processor() or platform.machine()


def provenance(
    adapter: ModelAdapter,
    device: torch.device,
    *,
    seed: int | None,
    text_source: str,
    batch_size: int,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Root attributes describing where the numbers came from (SPEC section 4, plus a few more)."""
    import h5py
    import transformers

    from biasviz import __version__

    dev, dev_name = _device_label(device)
    attrs: dict[str, Any] = {
        "scheme": adapter.scheme,
        "context_dependent": _scheme_flag(adapter, "context_dependent", False),
        "source_model": adapter.source,
        "model_sha256": adapter.sha256,
        "architecture": adapter.architecture,
        "n_layers": int(adapter.n_layers),
        "device": dev,
        "device_name": dev_name,
        "seed": -1 if seed is None else int(seed),
        "text_source": text_source,
        "bias_convention": adapter.bias_convention,
        "config_json": getattr(adapter, "config_json", "") or "",
        "batch_size": int(batch_size),
        "biasviz_version": __version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "h5py_version": h5py.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
    }
    attrs.update(extra or {})
    return attrs


def check_seq_len(adapter: ModelAdapter, seq_len: int) -> None:
    """Learned absolute positions end at the table's size; relative schemes take any length."""
    max_len = adapter.max_length
    if max_len is not None and seq_len > max_len:
        raise BiasvizError(
            f"--seq-len {seq_len} exceeds the {max_len} positions of this '{adapter.scheme}' model "
            f"(learned absolute positions cannot extrapolate); use --seq-len {max_len} or less"
        )


def check_windows(adapter: ModelAdapter, windows: np.ndarray) -> np.ndarray:
    """Validate token windows against the model: shape, length limit, vocabulary."""
    w = np.asarray(windows)
    if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise BiasvizError(f"expected token windows of shape (samples, seq_len), got {w.shape}")
    if not np.issubdtype(w.dtype, np.integer):
        raise BiasvizError(f"token windows must be integers, got {w.dtype}")
    check_seq_len(adapter, int(w.shape[1]))
    vocab = getattr(adapter, "vocab_size", None)
    if w.min() < 0 or (vocab is not None and w.max() >= vocab):
        raise BiasvizError(
            f"token ids range over [{w.min()}, {w.max()}], outside the model's vocabulary of {vocab}: "
            "the tokenizer does not belong to this model; pass the model's own with --tokenizer"
        )
    return w.astype(np.int64, copy=False)


def extract(
    adapter: ModelAdapter,
    windows: np.ndarray,
    out: str | Path,
    *,
    layers: int | str | list[int] = -1,
    dtype: str = "float32",
    batch_size: int = 1,
    device: str | torch.device = "auto",
    force: bool = False,
    seed: int | None = None,
    text_source: str = "",
    attrs: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> ExtractResult:
    """Run ``adapter`` on ``windows`` (samples, T) and write format-1 HDF5 to ``out``.

    ``layers``: -1 (the final layer), an index, a list, or ``"all"``. ``dtype`` is the storage type.
    ``attrs`` adds root attributes (the tokenizer, say). ``progress`` None shows a bar on a terminal.
    The file appears at ``out`` only when complete; an existing file is kept unless ``force``.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    if out.exists() and not force:
        raise BiasvizError(f"{out} already exists; pass --force to overwrite it or choose another --out")
    if batch_size < 1:
        raise BiasvizError(f"--batch-size must be at least 1, got {batch_size}")
    ids = check_windows(adapter, windows)
    n, seq_len = ids.shape
    layer_list = adapter.resolve_layers(layers)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    has_bias = _scheme_flag(adapter, "adds_bias", True)
    meta = provenance(adapter, dev, seed=seed, text_source=text_source, batch_size=batch_size, extra=attrs)
    adapter.to(dev)
    adapter.model.eval()
    copier = _HostCopy(dev)
    show = sys.stderr.isatty() if progress is None else progress
    t0 = time.perf_counter()
    writer = BiasFileWriter(
        out, attrs=meta, n_samples=n, n_heads=adapter.n_heads, seq_len=seq_len, layers=layer_list,
        has_bias=has_bias, dtype=dtype, force=force, causal=bool(getattr(adapter, "causal", True)),
    )  # fmt: skip
    with (
        writer,
        adapter.capture(layer_list, want_bias=has_bias) as got,
        tqdm(total=n, unit="sample", disable=not show, file=sys.stderr, desc="extract", leave=False) as bar,
    ):
        pending: _Batch | None = None
        for start in range(0, n, batch_size):
            batch = ids[start : start + batch_size]  # (b, T)
            x = torch.from_numpy(batch)
            x = x.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else x
            got.clear()
            adapter.forward(x)
            _check_captured(got, layer_list, has_bias, adapter)
            current = copier.start(batch, got)
            got.clear()  # drop the device tensors: the copy holds what it needs
            if pending is not None:  # written while the device computes the batch just queued
                _write(writer, pending.wait())
                bar.update(len(pending.input_ids))
            pending, current = current, None
            if not copier.cuda:  # nothing runs meanwhile: write now, so one batch at a time is held
                _write(writer, pending)
                bar.update(len(pending.input_ids))
                pending = None
        if pending is not None:
            _write(writer, pending.wait())
            bar.update(len(pending.input_ids))
    seconds = time.perf_counter() - t0
    return ExtractResult(out, n, seq_len, layer_list, has_bias, seconds, out.stat().st_size)


def _check_captured(got: Captured, layers: list[int], has_bias: bool, adapter: ModelAdapter) -> None:
    missing = [layer for layer in layers if layer not in got.weights]
    if has_bias:
        missing += [layer for layer in layers if layer not in got.bias]
    if missing:
        raise BiasvizError(
            f"the {adapter.architecture} model ran but nothing was captured for layer(s) {sorted(set(missing))}; "
            "its attention may use a fused kernel that never forms the weights"
        )


def _write(writer: BiasFileWriter, batch: _Batch) -> None:
    writer.write_batch(batch.input_ids, batch.weights, batch.bias if writer.has_bias else None)


# -- inputs ---------------------------------------------------------------------------------------
BYTE_VOCAB = 256


def _byte_chars() -> list[str]:
    """The printable character byte-level BPE uses for each byte 0..255 (GPT-2's byte alphabet)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, extra = [], 0
    for b in range(BYTE_VOCAB):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(BYTE_VOCAB + extra))
            extra += 1
    return chars


def byte_level_tokenizer(vocab_size: int) -> Any:
    """A tokenizer whose ids are the UTF-8 bytes of the text (plus EOS = 256 when it fits).

    >>> byte_level_tokenizer(300).encode("hé").ids
    [104, 195, 169]
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from biasviz.data.tokenizer import EOS

    vocab = {ch: b for b, ch in enumerate(_byte_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    if vocab_size > BYTE_VOCAB:
        tok.add_special_tokens([EOS])  # id 256
    return tok


def resolve_tokenizer(adapter: ModelAdapter, override: str | Path | None) -> tuple[Any, str]:
    """The tokenizer to use and a description for the file: ``--tokenizer``, the checkpoint's, or bytes.

    The byte-level fallback is used only when the model's vocabulary holds every byte, and with a
    warning: it is almost certainly not the tokenizer the model was trained with.
    """
    import warnings

    from biasviz.data import load_tokenizer

    if override is not None:
        p = Path(override).expanduser()
        return load_tokenizer(p), str(p.resolve())
    if adapter.tokenizer is not None:
        return adapter.tokenizer, f"{adapter.source} (the checkpoint's own)"
    vocab = getattr(adapter, "vocab_size", None)
    if vocab is None or vocab < BYTE_VOCAB:
        raise BiasvizError(
            f"{adapter.source} comes without a tokenizer and its vocabulary ({vocab}) cannot hold raw bytes; "
            "pass --tokenizer PATH (the tokenizer.json the model was trained with)"
        )
    warnings.warn(
        f"{Path(adapter.source).name} comes without a tokenizer.json; feeding it UTF-8 bytes (ids 0-255), "
        "which is probably not how it was trained. Pass --tokenizer for the model's own tokenizer.",
        stacklevel=2,
    )
    return byte_level_tokenizer(vocab), "byte-level (UTF-8 bytes as ids; no tokenizer came with the model)"
