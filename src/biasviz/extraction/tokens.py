"""Which tokenizer turns the text into a model's token ids: ``--tokenizer``, the checkpoint's own, or bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from biasviz.adapters.base import ModelAdapter
from biasviz.common.errors import BiasvizError

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
        from biasviz.adapters.files import tokenizer_file

        return adapter.tokenizer, f"{tokenizer_file(adapter.source)} (the checkpoint's own)"
    vocab = adapter.vocab_size
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
