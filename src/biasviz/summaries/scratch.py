"""Working memory kept from one block of rows to the next, for as long as its owner keeps it.

A summary's temporaries are a few MiB per block of rows, thousands of blocks per layer. Allocated anew each
time, their pages come fresh from the system (the allocator gives large freed blocks back), and the page faults
cost more than the arithmetic on them; one buffer reused costs nothing after the first block. Whoever forms a
layer's rows block by block owns one and hands it down (:mod:`biasviz.summaries.replay`), so that it is given
back with the layer; without one, each call allocates its temporaries as usual.
"""

from __future__ import annotations

import math

import torch


class Scratch:
    """One buffer of bytes, handed out as ``count`` tensors of one shape and any dtype; grown when a call needs more.

    What a call returns is valid until the next call: a tensor handed out is never kept by its caller.

    >>> s = Scratch()
    >>> a = s.take((2, 3), 2, torch.float64, torch.device("cpu"))
    >>> a.shape, s.take((3,), 1, torch.float32, torch.device("cpu")).data_ptr() == a.data_ptr()
    (torch.Size([2, 2, 3]), True)
    """

    def __init__(self) -> None:
        self._bytes = torch.empty(0, dtype=torch.uint8)

    def take(self, shape: tuple[int, ...], count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(count, *shape) of ``dtype`` on ``device``, uninitialised."""
        size = count * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        flat = self._bytes
        if flat.numel() < size or flat.device != device:
            flat = self._bytes = torch.empty(size, dtype=torch.uint8, device=device)
        return flat[:size].view(dtype).view(count, *shape)
