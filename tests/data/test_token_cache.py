"""The training corpus's tokenizer and tokens, kept between runs: what is read back is what a build makes, and an
entry that was tampered with is built again, never trusted."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from biasviz.data.token_cache import RECORD_FILE, TOKENS_FILE, cache_folder, corpus_key, tokenized
from biasviz.data.tokenizer import build_tokenizer

DOCS = [f"def f{i}(x):\n    return x * {i} + {i * i}\n" * 20 for i in range(40)]


def _independent(docs: list[str], vocab: int) -> tuple[Tokenizer, np.ndarray]:
    """The tokenizer and stream built directly with the tokenizers library: EOS after each document."""
    tok = build_tokenizer(docs, vocab)
    eos = tok.token_to_id("<|endoftext|>")
    ids = [i for enc in tok.encode_batch(docs) for i in [*enc.ids, eos]]
    return tok, np.asarray(ids, dtype=np.int32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BIASVIZ_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_second_run_reads_back_what_a_build_makes(cache):
    ref_tok, ref_ids = _independent(DOCS, 300)
    first_tok, first = tokenized(DOCS, 300)
    [entry] = (cache / "corpus").iterdir()
    assert entry.name == corpus_key(DOCS, 300, None)
    second_tok, second = tokenized(DOCS, 300)
    np.testing.assert_array_equal(first, ref_ids)
    np.testing.assert_array_equal(second, ref_ids)
    assert second_tok.to_str() == ref_tok.to_str() == first_tok.to_str()
    record = json.loads((entry / RECORD_FILE).read_text())
    assert record["tokens_sha256"] == hashlib.sha256((entry / TOKENS_FILE).read_bytes()).hexdigest()


def test_the_entry_depends_on_every_input(cache):
    keys = {corpus_key(DOCS, 300, None), corpus_key(DOCS, 301, None), corpus_key(DOCS[:-1], 300, None),
            corpus_key(["ab", "c"], 300, None), corpus_key(["a", "bc"], 300, None),
            corpus_key(DOCS, 300, build_tokenizer(DOCS, 260))}  # fmt: skip
    assert len(keys) == 6


def test_a_tampered_entry_is_built_again(cache):
    _, ref_ids = _independent(DOCS, 300)
    tokenized(DOCS, 300)
    [entry] = (cache / "corpus").iterdir()
    forged = ref_ids.copy()
    forged[5] = (forged[5] + 1) % 300
    np.save(entry / TOKENS_FILE, forged)  # the record's SHA-256 no longer matches
    _, got = tokenized(DOCS, 300)
    np.testing.assert_array_equal(got, ref_ids)
    assert hashlib.sha256((entry / TOKENS_FILE).read_bytes()).hexdigest() == json.loads(
        (entry / RECORD_FILE).read_text())["tokens_sha256"]  # fmt: skip


def test_ids_outside_the_vocabulary_or_a_pickle_are_refused(cache):
    _, ref_ids = _independent(DOCS, 300)
    tokenized(DOCS, 300)
    [entry] = (cache / "corpus").iterdir()
    for forged in (np.full(4, 10_000, dtype=np.int32), np.array([{"a": 1}], dtype=object)):
        with open(entry / TOKENS_FILE, "wb") as f:
            np.save(f, forged, allow_pickle=True)
        record = json.loads((entry / RECORD_FILE).read_text())
        record["tokens_sha256"] = hashlib.sha256((entry / TOKENS_FILE).read_bytes()).hexdigest()
        (entry / RECORD_FILE).write_text(json.dumps(record))
        _, got = tokenized(DOCS, 300)
        np.testing.assert_array_equal(got, ref_ids)


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("BIASVIZ_CACHE", "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_folder() is None
    _, got = tokenized(DOCS, 300)
    np.testing.assert_array_equal(got, _independent(DOCS, 300)[1])
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("BIASVIZ_CACHE", str(blocker / "below"))
    _, got = tokenized(DOCS, 300)
    np.testing.assert_array_equal(got, _independent(DOCS, 300)[1])


def test_the_default_folder_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("BIASVIZ_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_folder() == tmp_path / "biasviz"
