"""Text for extraction is read and tokenized only as far as the windows need, the same way every time."""

from __future__ import annotations

import numpy as np
import pytest

from biasviz.data import build_tokenizer, encode_prefix, open_corpus, sample_windows, window_span
from biasviz.data.tokenizer import eos_id


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("text")
    for k in range(40):
        (d / f"doc{k:02d}.txt").write_text("".join(f"line {k} {i} of the text, {i * k % 13}\n" for i in range(60)))
    return d


def test_prefix_equals_tokenizing_documents_one_by_one(corpus_dir) -> None:
    tok = build_tokenizer([p.read_text() for p in sorted(corpus_dir.iterdir())], 300)
    expected: list[int] = []  # independent construction: each file on its own, EOS between, in sorted order
    for p in sorted(corpus_dir.iterdir()):
        expected += tok.encode(p.read_text()).ids + [eos_id(tok)]
    for n in (10, 1000, len(expected), len(expected) + 50):
        docs, _ = open_corpus(corpus_dir)
        np.testing.assert_array_equal(encode_prefix(docs, tok, n, batch=3), expected[:n])


def test_only_the_documents_needed_are_read(corpus_dir) -> None:
    tok = build_tokenizer([(corpus_dir / "doc00.txt").read_text()], 300)
    read = []
    docs, _ = open_corpus(corpus_dir)
    counted = (read.append(d) or d for d in docs)
    encode_prefix(counted, tok, 50, batch=2)
    assert len(read) == 2  # one batch of two documents holds 50 tokens; the other 38 files stay unread


def test_windows_are_reproducible_and_inside_the_span(corpus_dir) -> None:
    tok = build_tokenizer([p.read_text() for p in sorted(corpus_dir.iterdir())], 300)
    assert window_span(2, 64) == 1 << 18 and window_span(64, 1024) == 16 * 64 * 1024
    docs, _ = open_corpus(corpus_dir)
    stream = encode_prefix(docs, tok, 2000)
    a = sample_windows(stream, 5, 32, seed=3)
    b = sample_windows(stream, 5, 32, seed=3)
    np.testing.assert_array_equal(a, b)
    text = stream.tolist()
    for w in a.tolist():  # every window is a contiguous run of the stream
        assert any(text[s : s + 32] == w for s in range(len(text) - 31))


def test_a_last_batch_stops_near_the_documents_needed(corpus_dir) -> None:
    """With the default batch of 16, the text read ends within a document of what the span needs."""
    tok = build_tokenizer([p.read_text() for p in sorted(corpus_dir.iterdir())], 300)
    counts = [len(tok.encode(p.read_text()).ids) + 1 for p in sorted(corpus_dir.iterdir())]  # each file, EOS after
    for n in (sum(counts[:20]) - 5, sum(counts[:23]) + 1, sum(counts[:37])):
        needed = next(k for k in range(1, len(counts) + 1) if sum(counts[:k]) >= n)
        read: list[str] = []
        docs, _ = open_corpus(corpus_dir)
        stream = encode_prefix((read.append(d) or d for d in docs), tok, n)
        assert len(stream) == n and needed <= len(read) <= needed + 1, (n, needed, len(read))
