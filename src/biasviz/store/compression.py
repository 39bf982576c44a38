"""How a full file's matrices are compressed: ``extract --compression gzip|gzip:N|lzf|none``.

``gzip`` (the default, level 1) and ``gzip:N`` store shuffle + deflate, encoded here (:mod:`.deflate`, ISA-L when
installed) and written as stored chunks; ``none`` stores the matrices as they are, also as stored chunks; ``lzf``
is h5py's own LZF filter (with the shuffle), which only h5py's filter path produces, so its matrices go through
h5py one at a time. Every h5py reads all four without plugins; other HDF5 tools may need the LZF plugin.
Summary files keep their own gzip whatever is chosen here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from biasviz.common.errors import UsageError

DEFAULT_LEVEL = 1
CHOICES = "gzip, gzip:N (N a level 0-9), lzf or none"


@dataclass(frozen=True)
class Compression:
    """One of the choices, as h5py's dataset filters (:attr:`filters`)."""

    name: str  # "gzip", "lzf" or "none"
    level: int | None = None  # gzip only

    @property
    def filters(self) -> dict[str, Any]:
        """The writer's ``compression``, ``compression_opts`` and ``shuffle`` (h5py's create_dataset keywords)."""
        if self.name == "none":
            return {"compression": None, "compression_opts": None, "shuffle": False}
        return {"compression": self.name, "compression_opts": self.level, "shuffle": True}

    @property
    def label(self) -> str:
        """``gzip:1``, ``lzf`` or ``none``: what ``--compression`` takes for this choice."""
        return f"gzip:{self.level}" if self.name == "gzip" else self.name


def parse_compression(value: Any) -> Compression:
    """``--compression`` (None: the default, gzip level 1) as a :class:`Compression`; anything else is one error.

    >>> parse_compression("gzip:6").filters
    {'compression': 'gzip', 'compression_opts': 6, 'shuffle': True}
    >>> parse_compression(None).label, parse_compression("LZF").label, parse_compression("none").label
    ('gzip:1', 'lzf', 'none')
    """
    if isinstance(value, Compression):
        return value
    text = "gzip" if value is None else str(value).strip().lower()
    name, sep, level = text.partition(":")
    if name == "gzip" and not sep:
        return Compression("gzip", DEFAULT_LEVEL)
    if name == "gzip" and level.isdigit() and len(level) == 1:
        return Compression("gzip", int(level))
    if text in ("lzf", "none"):
        return Compression(text)
    raise UsageError(f"--compression {value}: not {CHOICES}")
