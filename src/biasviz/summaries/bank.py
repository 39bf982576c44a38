"""Every sample's per-position tensors of a layer (q, k, the attention's input), kept until the layer is summarised.

A per-cell spread over samples needs every sample's value of a cell at once. Rather than run every sample
in one batch (memory N·T times the whole model's activations) or keep per-cell moments of every cell (T²),
summaries keep what forms a layer's cells again - N·T·(a few times the width) numbers - and form them block
of query rows by block of rows over all samples (:mod:`biasviz.summaries.replay`).

Up to ``budget`` bytes stay in memory (on the device that computed them); beyond that an array goes to an
anonymous temporary file (no name on disk: nothing is left behind, even by a killed run) in the folder the
caller names - beside the output, where the user chose to have room - and is read back by position ranges.
Positions are the leading axis of each sample's (T, F) array, so a prefix of keys is one contiguous read.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from biasviz.summaries.scratch import Scratch

BANK_BYTES = 1 << 30  # kept in memory by default (CPU); more goes to a temporary file
CUDA_BANK_FRACTION = 0.25  # of the GPU's memory


def default_budget(device: torch.device) -> int:
    """Bytes a bank keeps in memory on ``device`` before it spills to disk."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1] * CUDA_BANK_FRACTION)
    return BANK_BYTES


_BITS = (1, 2, 4, 8, 16, 32, 64, 128)


def pack_cells(cells: torch.Tensor) -> torch.Tensor:
    """(..., K) bool -> (..., ceil(K / 8)) uint8, cell 8m + b in bit b of byte m.

    >>> pack_cells(torch.tensor([[True, False, True, True, False, False, False, False, True]])).tolist()
    [[13, 1]]
    """
    keys = cells.shape[-1]
    padded = torch.nn.functional.pad(cells.to(torch.uint8), (0, -keys % 8))
    bits = torch.tensor(_BITS, dtype=torch.uint8, device=cells.device)
    return (padded.view(*cells.shape[:-1], -1, 8) * bits).sum(-1, dtype=torch.uint8)


def unpack_cells(packed: torch.Tensor, keys: int) -> torch.Tensor:
    """:func:`pack_cells` undone: (..., ceil(K / 8)) uint8 -> (..., K) bool, keys past ``keys`` dropped.

    >>> unpack_cells(torch.tensor([[13, 1]], dtype=torch.uint8), 9).int().tolist()
    [[1, 0, 1, 1, 0, 0, 0, 0, 1]]
    """
    bits = torch.tensor(_BITS, dtype=torch.uint8, device=packed.device)
    cells = (packed[..., : -(-keys // 8), None] & bits) != 0
    return cells.flatten(-2)[..., :keys]


class _Spilled:
    """One (samples, T, F) array in an anonymous file, written and read by sample and position range."""

    def __init__(self, directory: Path | None, shape: tuple[int, int, int], dtype: torch.dtype) -> None:
        self.file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 (closed by close()); O_TMPFILE where the system has it: never named
        self.shape, self.dtype = shape, dtype
        self.row_bytes = shape[2] * torch.empty((), dtype=dtype).element_size()
        self._read = Scratch()  # what read() returns a view of

    def _offset(self, sample: int, position: int) -> int:
        return (sample * self.shape[1] + position) * self.row_bytes

    def write(self, sample: int, values: torch.Tensor) -> None:
        """``values`` (b, T, F): samples ``sample .. sample + b - 1``."""
        raw = memoryview(values.detach().to("cpu", self.dtype).contiguous().view(torch.uint8).numpy())
        offset, done = self._offset(sample, 0), 0
        while done < len(raw):  # one call writes at most about 2 GiB on Linux
            wrote = os.pwrite(self.file.fileno(), raw[done:], offset + done)
            if wrote == 0:
                raise OSError(f"the temporary file of a summary took {done} of {len(raw)} bytes")
            done += wrote

    def read(self, sample: int, start: int, stop: int) -> torch.Tensor:
        """Positions ``start .. stop - 1`` of one sample, read straight into this array's one buffer: valid until
        the next read of this array. A block of rows formed again reads a sample's keys (and input) once per block
        and sample, tens of MB each at T = 16384: a new copy each time (bytes, then a bytearray) cost more than
        forming the rows, and fresh pages every time more still."""
        n = (stop - start) * self.row_bytes
        # taken whole-sample every time: the buffer is allocated once, not grown as reads of key prefixes grow
        flat = self._read.take((self.shape[1] * self.row_bytes,), 1, torch.uint8, torch.device("cpu"))[0, :n]
        into, offset, done = memoryview(flat.numpy()), self._offset(sample, start), 0
        while done < n:  # as for writes: at most about 2 GiB a call
            got = os.preadv(self.file.fileno(), [into[done:]], offset + done)
            if got == 0:
                raise OSError(f"the temporary file of a summary returned {done} of {n} bytes")
            done += got
        return flat.view(self.dtype).view(stop - start, self.shape[2])

    def close(self) -> None:
        self.file.close()
        self._read = Scratch()


class SampleBank:
    """Per (layer, name): every sample's (T, F) tensor. :attr:`start` is the first sample of the batch under way."""

    def __init__(self, samples: int, *, device: torch.device, budget: int | None = None,
                 directory: str | Path | None = None) -> None:  # fmt: skip
        self.samples, self.device = samples, device
        self.budget = default_budget(device) if budget is None else int(budget)
        self.directory = None if directory is None else Path(directory)
        self.start = 0
        # whether a call may keep each sample's own attended cells (masks that differ by sample); not where
        # torchrun's processes join their banks, each process having measured only its own samples' masks
        self.cells_by_sample = True
        self.in_memory = 0  # bytes held in memory
        self._arrays: dict[tuple[int, str], torch.Tensor | _Spilled] = {}

    @property
    def spilled(self) -> bool:
        return any(isinstance(a, _Spilled) for a in self._arrays.values())

    def put(self, layer: int, name: str, values: torch.Tensor, at: int | None = None) -> None:
        """Keep ``values`` (b, T, F) as samples ``at .. at + b - 1`` (default :attr:`start` ..) of ``name`` in
        ``layer``."""
        at = self.start if at is None else at
        key = (layer, name)
        array = self._arrays.get(key)
        if array is None:
            shape = (self.samples, values.shape[1], values.shape[2])
            size = shape[0] * shape[1] * shape[2] * values.element_size()
            if self.in_memory + size <= self.budget:
                array = torch.empty(shape, dtype=values.dtype, device=self.device)
                self.in_memory += size
            else:
                array = _Spilled(self.directory, shape, values.dtype)
            self._arrays[key] = array
        if isinstance(array, _Spilled):
            array.write(at, values)
        else:
            array[at : at + values.shape[0]] = values.detach()

    def put_cells(self, layer: int, name: str, cells: torch.Tensor, at: int | None = None) -> None:
        """Keep boolean ``cells`` (b, 1 or H, T, K) as :meth:`put` keeps values, eight cells a byte, each position's
        heads side by side: a sample's mask of (T, K) cells is T·K / 8 bytes (32 MiB at T = 16384), H times that where
        its heads attend cells of their own. A sample whose heads differ, after samples kept with one set of cells for
        all heads, gives those samples' cells to every head (and a later one-for-all sample is kept for every head)."""
        at = self.start if at is None else at
        heads = cells.shape[1]
        held = self.cell_heads(layer, name) if self.holds(layer, name) else heads
        if heads > held:  # the samples kept so far, given to every head, in a new array (the old one given back)
            self._widen_cells(layer, name, heads, at)
        elif heads < held:
            cells = cells.expand(-1, held, -1, -1)
        packed = pack_cells(cells)  # (b, heads, T, ceil(K / 8))
        self.put(layer, name, packed.transpose(1, 2).flatten(2), at)

    def _widen_cells(self, layer: int, name: str, heads: int, samples: int) -> None:
        """Samples ``0 .. samples - 1`` of one-for-all-heads cells rewritten for ``heads`` heads, a sample at a time."""
        key = (layer, name)
        old = self._arrays.pop(key)
        if not isinstance(old, _Spilled):
            self.in_memory -= old.numel() * old.element_size()
        try:
            for a in range(samples):
                one = old.read(a, 0, old.shape[1]) if isinstance(old, _Spilled) else old[a]  # (T, K8)
                self.put(layer, name, one[None, :, None].expand(-1, -1, heads, -1).flatten(2).to(self.device), at=a)
        finally:
            if isinstance(old, _Spilled):
                old.close()

    def cell_heads(self, layer: int, name: str) -> int:
        """How many heads' cells :meth:`put_cells` keeps of ``name`` in ``layer``: 1 (one set for all heads) or H."""
        array = self._arrays[(layer, name)]
        return array.shape[2] // -(-array.shape[1] // 8)  # each position: heads x ceil(T / 8) bytes (square calls)

    def get_cells(self, layer: int, name: str, sample: int, start: int, stop: int, keys: int) -> torch.Tensor:
        """Rows ``start .. stop - 1`` of one sample's cells kept by :meth:`put_cells`, keys ``0 .. keys - 1``: (1 or H,
        rows, keys) bool, a new tensor."""
        heads = self.cell_heads(layer, name)
        packed = self.get(layer, name, sample, start, stop)
        return unpack_cells(packed.view(stop - start, heads, -1), keys).transpose(0, 1)

    def holds(self, layer: int, name: str) -> bool:
        return (layer, name) in self._arrays

    def names(self) -> list[tuple[int, str]]:
        """Every (layer, name) held."""
        return list(self._arrays)

    def seq_len(self, layer: int, name: str) -> int:
        array = self._arrays[(layer, name)]
        return array.shape[1]

    def get(self, layer: int, name: str, sample: int, start: int, stop: int) -> torch.Tensor:
        """Positions ``start .. stop - 1`` of one sample: (stop - start, F), on the bank's device. From the temporary
        file on the CPU it is a view of that array's one read buffer: valid until the next ``get`` of the same
        (layer, name)."""
        array = self._arrays[(layer, name)]
        if isinstance(array, _Spilled):
            return array.read(sample, start, stop).to(self.device)
        return array[sample, start:stop]

    def whole(self, layer: int, name: str) -> torch.Tensor | None:
        """Every sample's (N, T, F) array of ``name`` in ``layer`` where it is held in memory (the fused kernels
        read it in place); None where it spilled to a file."""
        array = self._arrays[(layer, name)]
        return None if isinstance(array, _Spilled) else array

    def every(self, layer: int, name: str) -> torch.Tensor:
        """Every sample's (N, T, F) array of ``name`` in ``layer``: held in memory, as it is (:meth:`whole`); spilled,
        read a sample at a time into a copy of its own (each :meth:`get` reuses one buffer). For arrays small beside q
        and k (sink logits, rows of keys), or what is sent elsewhere whole."""
        whole = self.whole(layer, name)
        if whole is not None:
            return whole
        length = self.seq_len(layer, name)
        return torch.stack([self.get(layer, name, a, 0, length).clone() for a in range(self.samples)])

    def drop(self, layer: int) -> None:
        """Forget ``layer`` (summarised): its memory or file is given back."""
        for key in [k for k in self._arrays if k[0] == layer]:
            array = self._arrays.pop(key)
            if isinstance(array, _Spilled):
                array.close()
            else:
                self.in_memory -= array.numel() * array.element_size()

    def close(self) -> None:
        for layer in {k[0] for k in self._arrays}:
            self.drop(layer)

    def sample_sum(self, layer: int, name: str, heads: int) -> torch.Tensor:
        """Σ over the samples of one (T, H·d) array, as (T, H, d) float64."""
        seq_len = self.seq_len(layer, name)
        total = self.get(layer, name, 0, 0, seq_len).double()
        for a in range(1, self.samples):
            total += self.get(layer, name, a, 0, seq_len)
        return total.view(seq_len, heads, -1)

    def operands(self, layer: int) -> Callable[[int, int, int, int], tuple[torch.Tensor, torch.Tensor]]:
        """(a, r0, r1, k0) -> sample a's q at rows r0 .. r1 - 1 and k at keys k0 .. r1 - 1, as :meth:`get` gives
        them (valid until the next read of the same name): a spilled bank reads only those keys."""
        return lambda a, r0, r1, k0: (self.get(layer, "q", a, r0, r1), self.get(layer, "k", a, k0, r1))
