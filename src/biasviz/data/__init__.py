"""Text, tokenizers and token windows: everything between files on disk and input ids."""

from biasviz.data.corpus import Corpus, load_corpus, open_corpus
from biasviz.data.tokenizer import build_tokenizer, load_tokenizer, save_tokenizer
from biasviz.data.windows import encode, encode_prefix, sample_windows, window_span

__all__ = [
    "Corpus", "load_corpus", "open_corpus", "build_tokenizer", "load_tokenizer", "save_tokenizer", "encode",
    "encode_prefix", "sample_windows", "window_span",
]  # fmt: skip
