"""Preparing captured matrices for HDF5 on the GPU, so that the host only compresses and writes.

Each stored (sample, head) matrix is one HDF5 chunk, stored as shuffle + deflate of the masked matrix
in the storage dtype (with ``extract --compression none``, the masked matrix's bytes as they are). On a
CUDA device everything but the deflate is done where the tensors already are (mask, NaN fill, finite and
float16-range checks, dtype cast, the shuffle's byte transposition), on a side stream, and the resulting
bytes are copied into a small ring of pinned host buffers. Worker threads take a buffer as soon as its
copy has landed, compress it (zlib releases the GIL) and hand the buffer back; the calling thread writes
the compressed chunks in order. The GPU meanwhile computes the next batch. Memory stays bounded: one
matrix of temporaries on the GPU, the pinned ring (at most ``PINNED_BUDGET``) and one matrix per worker
on the host.

The bytes are identical to what :class:`biasviz.store.BiasFileWriter` produces on the CPU.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from biasviz.store.deflate import compression_threads, deflate
from biasviz.store.format import FLOAT16_MAX, float16_overflow_error, non_finite_error

PINNED_BUDGET = 2 << 30  # bytes of pinned host memory for the ring (at least two matrices)


@dataclass(frozen=True)
class Chunk:
    """One compressed matrix on its way to the file: where it goes and the future of its bytes."""

    kind: str  # "bias", "weights" or "scores"
    layer: int
    samples: tuple[int, ...]  # batch-relative samples that store it (all of them for a shared (1, ...) bias)
    head: int  # 0-based
    data: Future[bytes]


class GpuChunkEncoder:
    """Turns captured CUDA tensors into compressed HDF5 chunks, overlapping copy, compression and compute."""

    def __init__(
        self,
        device: torch.device,
        *,
        seq_len: int,
        storage: np.dtype,
        causal: bool,
        level: int | None,
        layer_causal: Mapping[int, bool] | None = None,
        shuffle: bool,
        workers: int | None = None,
        pinned_budget: int = PINNED_BUDGET,
    ) -> None:
        self.device = device
        self.storage = torch.float16 if np.dtype(storage) == np.float16 else torch.float32
        self.itemsize = np.dtype(storage).itemsize
        self._int = torch.int16 if self.itemsize == 2 else torch.int32
        self._nan_bits = int(np.array(np.nan, dtype=storage).view(np.int16 if self.itemsize == 2 else np.int32))
        self.seq_len, self.level, self.shuffle = seq_len, level, shuffle
        j = torch.arange(seq_len, device=device)
        self.causal, self.layer_causal = causal, dict(layer_causal or {})
        # True where masked, for each rule the layers take (each layer's own where the model's calls differ:
        # writer.layer_causal), a (T, T) mask on the device for each rule used only
        self.masks = {rule: j[None, :] > j[:, None] if rule else torch.zeros(seq_len, seq_len, dtype=torch.bool,
                                                                             device=device)
                      for rule in {causal, *self.layer_causal.values()}}  # fmt: skip
        self.stream = torch.cuda.Stream(device)
        self.nbytes = seq_len * seq_len * self.itemsize
        self.workers = compression_threads(workers)
        self.n_buffers = max(2, min(self.workers + 1, pinned_budget // max(self.nbytes, 1)))
        self._free: queue.Queue[torch.Tensor] = queue.Queue()
        self._allocated = 0
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="biasviz-gpu-encode")

    def see_every_key(self, layers: Iterable[int]) -> None:
        """Every cell of ``layers`` kept in later chunks (as the writer's
        :meth:`~biasviz.store.shared_bias.SharedBiasSwitch.see_every_key`)."""
        self.layer_causal.update(dict.fromkeys(layers, False))
        self.masks.setdefault(False, torch.zeros(self.seq_len, self.seq_len, dtype=torch.bool, device=self.device))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GpuChunkEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- encoding -------------------------------------------------------------------------------
    def prepare(self, kind: str, matrix: torch.Tensor, causal: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One (T, T) matrix as the bytes HDF5 stores before deflate (masked by ``causal``'s rule, the encoder's by
        default; cast, shuffled; flat uint8), and its check values (all used cells finite, largest magnitude) as a
        2-element tensor."""
        masked = self.masks[self.causal if causal is None else bool(causal)]
        m = matrix.to(torch.float32).masked_fill(masked, 0.0)
        checks = torch.stack([torch.isfinite(m).all().float(), m.abs().amax()])
        m = m.to(self.storage)
        if kind != "weights":  # bias, scores: NaN with NumPy's bits (CUDA's float -> half conversion makes another)
            m.view(self._int).masked_fill_(masked, self._nan_bits)
        raw = m.view(torch.uint8)  # (T, T * itemsize)
        if self.shuffle:  # HDF5's shuffle: byte k of every element, for k = 0, 1, ...
            raw = raw.reshape(-1, self.itemsize).t().contiguous()
        return raw.reshape(-1), checks

    def encode(self, tensors: dict[tuple[str, int], torch.Tensor]) -> Iterator[Chunk]:
        """Yield a :class:`Chunk` per distinct matrix of ``tensors`` ((kind, layer) -> (b or 1, H, T, T)).

        Blocks only while every pinned buffer is busy; the chunks' futures complete in the worker threads.
        NaN, infinity or float16 overflow raise a ``BiasvizError`` once the batch has been queued (one
        device synchronisation per batch), before any of it can be published.
        """
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # the tensors have been computed
        batch = max(t.shape[0] for t in tensors.values()) if tensors else 0
        checks: list[tuple[str, int, torch.Tensor]] = []
        for (kind, layer), t in tensors.items():
            t.record_stream(self.stream)  # its memory stays valid until the side stream is done with it
            for s in range(t.shape[0]):
                targets = tuple(range(batch)) if t.shape[0] == 1 else (s,)
                for h in range(t.shape[1]):
                    buf = self._buffer()
                    with torch.cuda.stream(self.stream):
                        data, check = self.prepare(kind, t[s, h], self.layer_causal.get(layer))
                        buf.copy_(data, non_blocking=True)
                        landed = torch.cuda.Event()
                        landed.record(self.stream)
                    checks.append((kind, layer, check))
                    yield Chunk(kind, layer, targets, h, self._pool.submit(self._compress, buf, landed))
        self._raise_on_bad_values(checks)

    def _raise_on_bad_values(self, checks: list[tuple[str, int, torch.Tensor]]) -> None:
        if not checks:
            return
        with torch.cuda.stream(self.stream):
            values = torch.stack([c for _, _, c in checks]).tolist()
        for (kind, layer, _), (finite, peak) in zip(checks, values, strict=True):
            if not finite:
                raise non_finite_error(kind, layer)
            if self.storage == torch.float16 and peak > FLOAT16_MAX:
                raise float16_overflow_error(kind, layer, peak)

    def _buffer(self) -> torch.Tensor:
        if self._free.empty() and self._allocated < self.n_buffers:
            self._allocated += 1
            return torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
        return self._free.get()

    def _compress(self, buf: torch.Tensor, landed: torch.cuda.Event) -> bytes:
        landed.synchronize()
        try:
            if self.level is None:  # --compression none: the bytes as they are, one copy out of the pinned buffer
                return buf.numpy().tobytes()
            host = buf.numpy().copy()  # frees the pinned buffer for the next copy while this one compresses
        finally:
            self._free.put(buf)
        return deflate(host.data, self.level)
