"""Byte-level BPE tokenizers (:mod:`biasviz.data.tokenizer`): built from a corpus with the size asked for and the
end-of-text token first, every text encoded with no unknown token, its tokens' bytes (read through GPT-2's
byte-to-character table, written out here) being the text's UTF-8 bytes; saved beside a checkpoint and loaded
back from the file or its folder, whatever the path's bytes; and the library's calls fenced so that a failure is one
error and its noise on stderr is dropped, while a call that succeeds keeps what it wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.data.tokenizer import (
    EOS,
    REPLAYED,
    build_tokenizer,
    eos_id,
    load_tokenizer,
    save_tokenizer,
    tokenizer_boundary,
)

CORPUS = ["the cat sat on the mat. the dog sat on the log. " * 20, "def f(x):\n    return x * 2  # doubled\n" * 20]
TEXTS = ["the cat", "Ünïcödé — 東京 🐈\x00\t\r\n", " leading and trailing  ", "", "<|endoftext|>x"]


def gpt2_byte_to_char() -> dict[int, str]:
    """GPT-2's table (``bytes_to_unicode`` in its encoder.py): printable bytes stand for themselves, the other 68
    bytes for the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201
    return build_tokenizer(CORPUS, vocab_size=300)


def test_the_vocabulary_is_every_byte_the_end_of_text_token_first_and_one_token_per_merge(tok) -> None:
    merges = json.loads(tok.to_str())["model"]["merges"]
    assert tok.get_vocab_size() == 256 + 1 + len(merges) <= 300  # no more than asked (a small corpus runs out of pairs)
    assert eos_id(tok) == 0 and tok.id_to_token(0) == EOS
    table = gpt2_byte_to_char()
    assert set(table.values()) <= set(tok.get_vocab())  # every byte has a token of its own


@pytest.mark.parametrize("text", TEXTS)
def test_every_text_is_its_tokens_bytes(tok, text: str) -> None:
    char_to_byte = {c: b for b, c in gpt2_byte_to_char().items()}
    encoding = tok.encode(text)
    if text.startswith(EOS):  # the end-of-text token is one special token, read as itself
        assert encoding.ids[0] == 0 and encoding.tokens[0] == EOS
        assert bytes(char_to_byte[c] for t in encoding.tokens[1:] for c in t) == text[len(EOS) :].encode()
        return
    assert bytes(char_to_byte[c] for t in encoding.tokens for c in t) == text.encode("utf-8")
    assert tok.decode(encoding.ids) == text


def test_the_merges_make_the_corpus_words_whole() -> None:
    """One word of four letters, three merges (256 bytes and the end-of-text token leave 3 of 260): whichever pair each
    merge takes, three merges of a 4-letter word leave it one token; letters in another order meet no merge."""
    tok = build_tokenizer(["abcd"] * 50, vocab_size=260)
    assert tok.get_vocab_size() == 260
    assert tok.encode("abcd").tokens == ["abcd"]
    assert tok.encode("dcba").tokens == ["d", "c", "b", "a"]
    assert tok.encode(" abcd").tokens == ["Ġ", "abcd"]  # Ġ: the space byte; no space met in the corpus, no merge


def test_a_tokenizer_without_an_end_of_text_token_has_no_eos_id() -> None:
    from tokenizers import Tokenizer, models

    assert eos_id(Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))) is None


def test_a_saved_tokenizer_loads_back_from_its_file_or_its_folder(tok, tmp_path: Path) -> None:
    path = save_tokenizer(tok, tmp_path)
    assert path == tmp_path / "tokenizer.json"
    assert json.loads(path.read_text(encoding="utf-8"))["model"]["type"] == "BPE"
    for where in (path, tmp_path, str(tmp_path)):
        loaded = load_tokenizer(where)
        for text in TEXTS:
            assert loaded.encode(text).ids == tok.encode(text).ids


def test_a_path_that_is_not_utf8_and_a_home_path_load(tok, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = Path(os.fsdecode(b"ck-\xff\xfe"))  # bytes the system allows in a name and the Rust library cannot take
    folder = tmp_path / folder
    folder.mkdir()
    save_tokenizer(tok, folder)
    assert load_tokenizer(folder).encode("the cat").ids == tok.encode("the cat").ids
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_tokenizer("~/" + folder.name).encode("the cat").ids == tok.encode("the cat").ids


def test_a_saved_tokenizer_never_overwrites_nor_follows_a_link(tok, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("kept")
    with pytest.raises(FileExistsError):
        save_tokenizer(tok, tmp_path)
    assert (tmp_path / "tokenizer.json").read_text() == "kept"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "tokenizer.json").symlink_to(tmp_path / "target.json")
    with pytest.raises(BiasvizError, match="symbolic link"):
        save_tokenizer(tok, tmp_path / "elsewhere")
    assert not (tmp_path / "target.json").exists()


def test_a_missing_or_unreadable_tokenizer_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(BiasvizError, match=r"no tokenizer at .*tokenizer\.json; give a tokenizer\.json file"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
    with pytest.raises(BiasvizError, match="is not a readable tokenizers JSON file"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(BiasvizError, match="is not a readable tokenizers JSON file"):
        load_tokenizer(tmp_path / "tokenizer.json")


# --- the fence around the library's calls ---------------------------------------------------------------------------
class Panic(BaseException):
    """What the Rust library raises when it panics: not an Exception."""


def test_a_call_that_succeeds_keeps_what_it_wrote_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with tokenizer_boundary("t.json"):
        os.write(2, b"a warning of the library's\n")
    assert capfd.readouterr().err == "a warning of the library's\n"
    with tokenizer_boundary("t.json"):
        os.write(2, b"x" * (REPLAYED + 100))
    assert capfd.readouterr().err == "x" * REPLAYED  # no more than its first 64 KiB


@pytest.mark.parametrize("raised", [Panic("index out of bounds: the len is 3\nbacktrace ..."), ValueError("bad")])
def test_a_call_that_fails_is_one_error_and_its_stderr_is_dropped(
    raised: BaseException, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BiasvizError) as error, tokenizer_boundary("ck/tokenizer.json"):
        os.write(2, b"thread '<unnamed>' panicked at ...\n")
        raise raised
    first = str(raised).splitlines()[0]
    assert str(error.value).startswith(f"the tokenizer of ck/tokenizer.json failed on the text ({first}): ")
    assert error.value.__cause__ is raised
    os.write(2, b"after\n")  # stderr is the process's own again
    assert capfd.readouterr().err == "after\n"


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, MemoryError])
def test_an_interrupt_passes_through_the_fence(kind: type[BaseException], capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(kind), tokenizer_boundary("t.json"):
        raise kind()
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"
