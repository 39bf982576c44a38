"""Packing (query, key) matrices into compact text for the page, and the rules the page's script undoes.

A matrix travels as integers: the float32 bit patterns (exact) or 16-bit codes over the matrix's finite
range (quantised). Each integer is stored as its difference from the cell one row up and one column left
(``i - 1, j - 1``), so a bias that depends on i - j alone becomes zeros; the bytes are then grouped by
significance (HDF5's shuffle), deflated, and base64-encoded. The page's script (``core.js``) reverses the
steps in order.
When every residual past the first row and column is zero (the matrix is Toeplitz: ALiBi, KERPLE, T5), only
the first column and the first row travel (``toeplitz``), and the page reads cells from them directly.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np

from biasviz.store.deflate import deflate

#: 16-bit code of a NaN (masked) cell; finite values use 0 .. QMAX.
NAN_CODE = 0xFFFF
QMAX = 0xFFFE
#: Deflate level: ISA-L's fastest levels already take runs of zeros (constant diagonals) to almost nothing.
LEVEL = 3


@dataclass(frozen=True)
class Packed:
    """One encoded matrix: ``enc`` 'f32' (exact) or 'q16' (value = lo + code * step), base64 ``data``."""

    enc: str
    n: int
    data: str
    lo: float = 0.0
    step: float = 0.0
    factor: int = 1  # each cell is the mean of a factor x factor block of the full matrix
    toeplitz: bool = False  # ``data`` holds the first column, then the first row from its second cell

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"enc": self.enc, "n": self.n, "f": self.factor, "data": self.data}
        if self.toeplitz:
            out["toeplitz"] = True
        if self.enc == "q16":
            out.update(lo=self.lo, step=self.step)
        return out


def quantise(matrix: np.ndarray) -> tuple[np.ndarray, float, float]:
    """16-bit codes over the finite range: ``(codes, lo, step)``; the error is at most ``step / 2``.

    >>> codes, lo, step = quantise(np.array([[0.0, np.nan], [1.0, 0.5]], np.float32))
    >>> codes.tolist(), lo, step == 1 / QMAX
    ([[0, 65535], [65534, 32767]], 0.0, True)
    """
    m = np.asarray(matrix, dtype=np.float64)
    finite = np.isfinite(m)
    lo = float(m[finite].min()) if finite.any() else 0.0
    hi = float(m[finite].max()) if finite.any() else 0.0
    step = (hi - lo) / QMAX if hi > lo else 0.0
    codes = np.full(m.shape, NAN_CODE, dtype=np.uint16)
    if step > 0:
        codes[finite] = np.minimum(np.floor((m[finite] - lo) / step + 0.5), QMAX).astype(np.uint16)
    else:
        codes[finite] = 0
    return codes, lo, step


def dequantise(codes: np.ndarray, lo: float, step: float) -> np.ndarray:
    """The values the page shows for 16-bit ``codes`` (NaN where the code is :data:`NAN_CODE`)."""
    out = lo + codes.astype(np.float64) * step
    out[codes == NAN_CODE] = np.nan
    return out


def diagonal_residual(ints: np.ndarray) -> np.ndarray:
    """Each cell minus the cell at (i - 1, j - 1), modulo 2**bits; the first row and column stay as they are.

    >>> diagonal_residual(np.array([[5, 0], [7, 5]], np.uint16)).tolist()
    [[5, 0], [7, 0]]
    """
    out = ints.copy()
    out[1:, 1:] = ints[1:, 1:] - ints[:-1, :-1]  # unsigned arithmetic wraps, as the page's typed arrays do
    return out


def shuffle_bytes(ints: np.ndarray) -> bytes:
    """Little-endian bytes grouped by significance: all lowest bytes first, then the next, ...

    >>> shuffle_bytes(np.array([0x0102, 0x0304], np.uint16))
    b'\\x02\\x04\\x01\\x03'
    """
    little = np.ascontiguousarray(ints, dtype=ints.dtype.newbyteorder("<"))
    return little.view(np.uint8).reshape(-1, ints.dtype.itemsize).T.tobytes()


def _pack_ints(ints: np.ndarray) -> tuple[str, bool]:
    """Base64 text of the packed integers, and whether only the first column and row were kept."""
    residual = diagonal_residual(ints)
    toeplitz = ints.shape[-1] > 1 and not residual[1:, 1:].any()
    kept = np.concatenate([ints[:, 0], ints[0, 1:]]) if toeplitz else residual
    return base64.b64encode(deflate(shuffle_bytes(kept), LEVEL)).decode("ascii"), bool(toeplitz)


def pack_exact(matrix: np.ndarray) -> Packed:
    """The float32 values bit for bit (NaN stays NaN)."""
    m = np.ascontiguousarray(matrix, dtype=np.float32)
    m = np.where(np.isnan(m), np.float32(np.nan), m)  # one NaN bit pattern, so masked runs compress away
    data, toeplitz = _pack_ints(m.view(np.uint32))
    return Packed("f32", m.shape[-1], data, toeplitz=toeplitz)


def pack_quantised(matrix: np.ndarray, factor: int = 1) -> Packed:
    """16-bit codes over the matrix's own finite range (``factor``: the block size it was reduced by)."""
    codes, lo, step = quantise(matrix)
    data, toeplitz = _pack_ints(codes)
    return Packed("q16", codes.shape[-1], data, lo=lo, step=step, factor=factor, toeplitz=toeplitz)


def pack_bytes(raw: bytes) -> str:
    """Small side tables (profiles, token ids) as plain base64, without the matrix steps."""
    return base64.b64encode(raw).decode("ascii")


__all__ = ["NAN_CODE", "QMAX", "Packed", "quantise", "dequantise", "diagonal_residual", "shuffle_bytes",
           "pack_exact", "pack_quantised", "pack_bytes"]  # fmt: skip
