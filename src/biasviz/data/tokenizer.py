"""Byte-level BPE tokenizers, built locally from a corpus and saved beside the checkpoint."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from biasviz.common.atomic import write_new
from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import read_text, regular_file

EOS = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


def build_tokenizer(documents: list[str], vocab_size: int) -> Tokenizer:
    """Train a GPT-2-style byte-level BPE with at most ``vocab_size`` entries (EOS included): fewer where the
    documents run out of pairs to merge (``get_vocab_size()`` says how many; training reads it).

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
    text = read_text(p, "tokenizer.json")
    try:
        with tokenizer_boundary(str(p)):
            return Tokenizer.from_str(text)  # any path the system allows
    except BiasvizError as exc:  # tokenizers raises plain Exceptions for malformed files, panics for some
        raise BiasvizError(f"{p} is not a readable tokenizers JSON file ({exc.__cause__})") from exc.__cause__


_NOT_OURS = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)
#: bytes of a library's own stderr output replayed after a tokenizer call that succeeded
REPLAYED = 1 << 16


@contextlib.contextmanager
def tokenizer_boundary(what: str) -> Iterator[None]:
    """Run a call into the tokenizers library so that its failure is one :class:`BiasvizError` naming ``what``.

    The Rust library answers some crafted tokenizer.json files (a normalizer whose regex it cannot apply) with a
    panic: a ``PanicException``, which derives from BaseException, after writing the panic and a backtrace to the
    process's stderr. The call's stderr goes to a temporary file: dropped when the call fails, written out as it
    was when it succeeds.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    failed: BaseException | None = None
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except _NOT_OURS:
            raise
        except BaseException as exc:  # noqa: BLE001 - the library's panic is a BaseException
            failed = exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if failed is None:
            held.seek(0)
            said = held.read(REPLAYED)
            if said:
                os.write(2, said)
            return
    first = str(failed).strip().splitlines()[0][:200] if str(failed).strip() else type(failed).__name__
    raise BiasvizError(f"the tokenizer of {what} failed on the text ({first}): its tokenizer.json holds a "
                       "normalizer or pre-tokenizer the tokenizers library cannot run; it is damaged or "
                       "crafted") from failed  # fmt: skip


def eos_id(tok: Tokenizer) -> int | None:
    """The id of the end-of-text token, if the tokenizer has one."""
    return tok.token_to_id(EOS)
