"""Text, tokenizers and token windows: everything between files on disk and input ids."""

from biasviz.data.corpus import Corpus, load_corpus
from biasviz.data.tokenizer import build_tokenizer, load_tokenizer, save_tokenizer
from biasviz.data.windows import encode, sample_windows

__all__ = ["Corpus", "load_corpus", "build_tokenizer", "load_tokenizer", "save_tokenizer", "encode", "sample_windows"]
