"""Capture per-head biases and attention weights with forward hooks and stream them into HDF5.

Memory stays bounded by one batch whatever the number of samples: each batch is written as soon as
it is captured, and only the captured layers' tensors are kept. On CUDA each matrix is masked, cast
and byte-shuffled on the GPU and only its bytes cross to the host, through a small ring of pinned
buffers, to be compressed by host threads while the GPU computes the next batch; nothing else leaves
the GPU (the forward pass stops after the last captured layer, so there are no logits at all).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.common.devices import autocast_attrs, evaluating, placed, resolve_device, resolve_dtype
from biasviz.common.errors import BiasvizError, check_interrupted
from biasviz.common.memory import attention_bytes, check_fits
from biasviz.common.names import display_name
from biasviz.common.progress import Progress
from biasviz.extraction.batch_checks import check_captured, check_own_masks, see_every_key
from biasviz.extraction.full_matrices import full_matrices
from biasviz.extraction.same_bias import SameBias
from biasviz.store import BiasFileWriter
from biasviz.store.compression import parse_compression
from biasviz.store.format import BIAS_DIFFERENCE

CAPTURABLE = ("bias", "weights", "scores")  # what a full file can store per layer, in file order (docs/hdf5.md)
DEFAULT_CAPTURE = ("bias", "weights")


@dataclass
class ExtractResult:
    path: Path
    samples: int
    seq_len: int
    layers: list[int]
    has_bias: bool
    seconds: float
    bytes: int


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
    """Root attributes describing where the numbers came from (README, "The HDF5 file (format 1)")."""
    import h5py
    import transformers

    from biasviz.common.version import __version__

    dev, dev_name = _device_label(device)
    attrs: dict[str, Any] = {
        "scheme": adapter.scheme,
        "context_dependent": bool(adapter.context_dependent),
        "source_model": display_name(adapter.source),  # names as valid UTF-8, told apart (common.names)
        "model_sha256": adapter.sha256,
        "architecture": adapter.architecture,
        "n_layers": int(adapter.n_layers),
        "device": dev,
        "device_name": dev_name,
        "seed": -1 if seed is None else int(seed),
        "text_source": display_name(text_source),
        "bias_convention": adapter.bias_convention,
        "config_json": adapter.config_json or "",
        "batch_size": int(batch_size),
        "biasviz_version": __version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "h5py_version": h5py.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
    }
    if getattr(adapter, "training", None):  # how biasviz trained it: figures say so (a tiny run is not a paper's)
        attrs["training"] = adapter.training  # a dict: stored as JSON text
    attrs.update(getattr(adapter, "file_facts", dict)())  # a traced model's: context dependence unknown, call modules
    attrs.update({**autocast_attrs(), **(extra or {})})  # under autocast: the model's kernels ran so (docs/hdf5.md)
    return attrs


_FIX_MEMORY = "use fewer --samples, a smaller --batch-size or a shorter --seq-len"
_FIX_MATRICES = "use a smaller --batch-size, fewer layers, a shorter --seq-len, or --summary (keeps no T x T matrix)"


def check_windows_memory(samples: int, seq_len: int) -> None:
    """Refuse, before any text is read, token windows that cannot fit (int64 ids, on the host)."""
    check_fits(samples * seq_len * 8, f"{samples} windows of {seq_len} tokens", _FIX_MEMORY)


def check_batch_memory(adapter: ModelAdapter, layers: int, batch: int, seq_len: int, device: torch.device,
                       scores: bool = False, fix: str | None = None) -> None:  # fmt: skip
    """Refuse, before the forward pass, a batch that cannot fit: one (B, H, T, T) float32 matrix per captured
    layer for the weights, one for the bias and one for the scores, and for a bias declared the same for every
    input the first sample's per layer (compared with the others through a small buffer), on the device."""
    matrices = layers * (1 + int(bool(adapter.adds_bias)) + int(scores) + int(bias_is_shared(adapter)))
    check_fits(attention_bytes(batch, adapter.n_heads, seq_len, matrices),
               f"a batch of {batch} x {adapter.n_heads} heads x {seq_len} x {seq_len}", fix or _FIX_MATRICES, device)


def bias_is_shared(adapter: ModelAdapter) -> bool:
    """Whether the bias is the same for every input, so one copy stands for all samples (docs/hdf5.md)."""
    return bool(adapter.adds_bias) and not adapter.context_dependent and getattr(adapter, "context_known", True)


def check_seq_len(adapter: ModelAdapter, seq_len: int) -> None:
    """Learned absolute positions end at the table's size; relative schemes take any length."""
    adapter.check_length(seq_len)


def check_windows(adapter: ModelAdapter, windows: np.ndarray) -> np.ndarray:
    """Validate token windows against the model: shape, length limit, vocabulary."""
    w = np.asarray(windows)
    if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise BiasvizError(f"expected token windows of shape (samples, seq_len), got {w.shape}")
    if not np.issubdtype(w.dtype, np.integer):
        raise BiasvizError(f"token windows must be integers, got {w.dtype}")
    check_seq_len(adapter, int(w.shape[1]))
    vocab = adapter.vocab_size
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
    model_dtype: str | torch.dtype | None = None,
    force: bool = False,
    seed: int | None = None,
    text_source: str = "",
    attrs: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    capture: Sequence[str] = DEFAULT_CAPTURE,
    compression: Any = None,
) -> ExtractResult:
    """Run ``adapter`` on ``windows`` (samples, T) and write format-1 HDF5 to ``out``.

    ``layers``: -1 (the final layer), an index, a list, or ``"all"``. ``dtype`` is the storage type;
    ``model_dtype`` (``float32``, ``bfloat16``, ``float16``; None keeps the model's) the precision the
    model runs in. The model runs on ``device`` and is left where and as it was afterwards.
    ``attrs`` adds root attributes (the tokenizer, say). ``progress`` None shows a bar on a terminal.
    ``capture`` names what is stored (:func:`parse_capture`, scores on request), ``compression`` how (gzip, gzip:N,
    lzf or none: :func:`biasviz.store.compression.parse_compression`).
    The file appears at ``out`` only when complete; an existing file is kept unless ``force``.
    """
    t0 = time.perf_counter()
    kinds, filters = parse_capture(capture), parse_compression(compression).filters
    if "scores" in kinds and not adapter.captures_scores:
        raise BiasvizError(f"--capture scores: the {adapter.architecture} adapter does not form the scores; "
                           "'extract --summary' stores their maps for biasviz's models and traced attention calls")
    out = _new_output(out, force)
    if batch_size < 1:
        raise BiasvizError(f"--batch-size must be at least 1, got {batch_size}")
    ids = check_windows(adapter, windows)
    n, seq_len = ids.shape
    dev, run_dtype = _where_to_run(device, model_dtype)
    with evaluating(adapter.model), placed(adapter.model, dev, run_dtype):
        adapter.prepare(ids, layers)  # a traced model: its attention calls, from one pass where it will run
        layer_list = adapter.resolve_layers(layers)
        check_batch_memory(adapter, len(layer_list), min(batch_size, n), seq_len, dev, "scores" in kinds)
        held = {"bias": "bias" in kinds and bool(adapter.adds_bias), "weights": "weights" in kinds,
                "scores": "scores" in kinds}  # fmt: skip
        meta = provenance(adapter, dev, seed=seed, text_source=text_source, batch_size=batch_size, extra=attrs)
        meta["model_dtype"] = _dtype_label(run_dtype, adapter.model)
        _run(adapter, ids, out, dev, meta, layer_list, held, dtype, batch_size, force, progress, filters)
    seconds = time.perf_counter() - t0
    return ExtractResult(out, n, seq_len, layer_list, held["bias"], seconds, out.stat().st_size)


def parse_capture(names: str | Sequence[str]) -> list[str]:
    """``'bias,weights,scores'`` (or a list) -> the kinds a full file stores, in file order; others are an error.

    >>> parse_capture("scores, weights")
    ['weights', 'scores']
    """
    given = [n.strip().lower() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    bad = [n for n in given if n not in CAPTURABLE]
    if bad or "weights" not in given:
        why = f"unknown name(s) {', '.join(map(repr, bad))}" if bad else "the weights are always stored"
        raise BiasvizError(f"--capture {','.join(given) or repr('')}: {why}; name some of {', '.join(CAPTURABLE)}, "
                           "weights among them (the default is bias,weights; --bias-only stores the bias alone)")
    return [n for n in CAPTURABLE if n in given]


def _new_output(out: str | Path, force: bool) -> Path:
    """The output path, refused before any work when a file is there and ``force`` is not given."""
    from biasviz.common.outputs import check_output_file

    return check_output_file(Path(out), force=force)


def _where_to_run(
    device: str | torch.device, model_dtype: str | torch.dtype | None
) -> tuple[torch.device, torch.dtype | None]:
    """The device and the precision (None: the model's own) an extraction runs in."""
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    return dev, resolve_dtype(model_dtype)


def _dtype_label(run_dtype: torch.dtype | None, model: torch.nn.Module) -> str:
    """The precision the model runs in, for the file: the one asked for, else its first floating parameter's."""
    own = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return str(run_dtype or own).removeprefix("torch.")


def _run(
    adapter: ModelAdapter, ids: np.ndarray, out: Path, dev: torch.device, meta: dict[str, Any], layer_list: list[int],
    held: dict[str, bool], dtype: str, batch_size: int, force: bool, progress: bool | None, filters: dict[str, Any],
) -> None:  # fmt: skip
    """The capture loop: forward each batch and stream what was captured into the file.

    On a GPU the matrices are encoded there and compressed by host threads while the next batch is
    computed (:mod:`biasviz.store.gpu_encode`); on the CPU the writer masks, compresses and writes each batch.
    """
    n, seq_len = ids.shape
    rules = {layer: adapter.layer_causal(layer) for layer in layer_list}  # each call's own (an encoder-decoder's)
    writer = BiasFileWriter(out, attrs=meta, n_samples=n, n_heads=adapter.n_heads, seq_len=seq_len, layers=layer_list,
                            has_bias=held["bias"], has_scores=held["scores"], dtype=dtype, force=force,
                            causal=bool(adapter.causal), bias_shared=bias_is_shared(adapter), layer_causal=rules,
                            **filters)  # fmt: skip
    kinds = [kind for kind, on in held.items() if on]
    agreement = SameBias() if writer.bias_shared else None
    with (
        writer,
        full_matrices(adapter, layer_list, want_bias=held["bias"], want_scores=held["scores"]) as got,
        Progress(n, desc="extract", unit="sample", show=progress) as bar,
        _ChunkSink(writer, dev) as sink,
    ):
        for start in range(0, n, batch_size):
            batch = ids[start : start + batch_size]  # (b, T)
            got.clear()
            adapter.forward(torch.from_numpy(batch).to(dev))
            turned = [layer for layer in layer_list if writer.layer_causal[layer] and not adapter.layer_causal(layer)]
            if turned:  # calls taken as causal that attend keys after a query: every cell of theirs stored from here
                sink.drain()
                see_every_key(turned, adapter, writer, sink.encoder, kinds, start)
            check_captured(got, layer_list, kinds, adapter)
            check_own_masks(got, adapter, kinds)  # a call's own mask in its bias or scores: refused, with why
            later = start + batch_size < n  # a later batch is still to be compared with the first sample
            # declared context-free, measured otherwise: store one bias per sample from now on
            if agreement is not None and agreement.differs(got.bias, keep=later):
                sink.drain()
                writer.unshare_bias()
            # no name holds the batch's tensors once they are handed over: the next forward does not find the
            # last batch's (B, H, T, T) matrices still alive beside its own
            sink.put(batch, {(kind, layer): _storable(got.of(kind)[layer]) for kind in kinds for layer in layer_list})
            got.clear()
            bar.update(len(batch))
            check_interrupted()
        if agreement is not None:
            writer.record(BIAS_DIFFERENCE, agreement.largest)
        for key in [k for k, v in meta.items() if callable(v)]:  # measured at the end (a device map's peak memory)
            writer.record(key, meta[key])


_STORABLE = (torch.float32, torch.float16)


def _storable(t: torch.Tensor) -> torch.Tensor:
    """A captured tensor in a dtype NumPy and HDF5 know (a bfloat16 model's bias becomes float32)."""
    return t if t.dtype in _STORABLE else t.float()


class _ChunkSink:
    """Where captured batches go: encoded on the GPU and compressed in the background, or written directly."""

    def __init__(self, writer: BiasFileWriter, device: torch.device) -> None:
        from collections import deque

        self.writer = writer
        self.encoder = None
        if device.type == "cuda" and writer.direct_chunks:
            from biasviz.store.gpu_encode import GpuChunkEncoder

            self.encoder = GpuChunkEncoder(device, seq_len=writer.seq_len, storage=writer.dtype, causal=writer.causal,
                                           level=writer.deflate_level, shuffle=writer.shuffled,
                                           layer_causal=writer.layer_causal)  # fmt: skip
        self.pending: deque[tuple[int, Any]] = deque()  # (first sample of its batch, chunk), in order

    def __enter__(self) -> _ChunkSink:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        try:
            if exc_type is None:
                self.drain()
        finally:
            if self.encoder is not None:
                self.encoder.close()

    def put(self, ids: np.ndarray, tensors: dict[tuple[str, int], torch.Tensor]) -> None:
        if self.encoder is None:
            by_kind = {k: {layer: t.cpu() for (kind, layer), t in tensors.items() if kind == k} or None
                       for k in ("weights", "bias", "scores")}  # fmt: skip
            self.writer.write_batch(ids, by_kind["weights"] or {}, by_kind["bias"], by_kind["scores"])
            return
        first = self.writer.begin_batch(ids)
        limit = 4 * self.encoder.n_buffers  # compressed chunks waiting for their turn to be written
        for chunk in self.encoder.encode(tensors):
            self.pending.append((first, chunk))
            self._flush(lambda: bool(self.pending) and (self.pending[0][1].data.done() or len(self.pending) > limit))

    def drain(self) -> None:
        """Write every chunk still in flight (before the file's layout changes)."""
        self._flush(lambda: bool(self.pending))

    def _flush(self, more: Any) -> None:
        """Write finished chunks in order while ``more()`` says so (waiting for the oldest when needed)."""
        while more():
            first, chunk = self.pending.popleft()
            data = chunk.data.result()
            for s in chunk.samples:
                self.writer.write_chunk(chunk.kind, chunk.layer, first + s, chunk.head, data)
