"""Byte-level BPE tokenizers, built locally from a corpus and saved beside the checkpoint."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from biasviz.common.atomic import write_new
from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import read_text, regular_file

EOS = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


def build_tokenizer(documents: list[str], vocab_size: int) -> Tokenizer:
    """Train a GPT-2-style byte-level BPE with ``vocab_size`` entries (EOS included).

    Byte-level means every input can be encoded: there is no unknown token.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer=trainer, length=len(documents))
    return tok


def save_tokenizer(tok: Tokenizer, directory: str | Path) -> Path:
    path = Path(directory) / TOKENIZER_FILE
    write_new(path, tok.to_str())  # by Python, not the library: it takes only paths that are valid UTF-8
    return path


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a ``tokenizer.json`` file, or the one inside a directory (a checkpoint, say)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / TOKENIZER_FILE
    if not p.exists():
        raise BiasvizError(f"no tokenizer at {p}; give a tokenizer.json file or a directory holding one")
    regular_file(p, "tokenizer.json")
    try:
        return Tokenizer.from_str(read_text(p, "tokenizer.json"))  # any path the system allows
    except Exception as exc:  # tokenizers raises plain Exceptions for malformed files
        raise BiasvizError(f"{p} is not a readable tokenizers JSON file ({exc})") from exc


def eos_id(tok: Tokenizer) -> int | None:
    """The id of the end-of-text token, if the tokenizer has one."""
    return tok.token_to_id(EOS)
