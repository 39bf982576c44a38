"""The tokenizer an extraction uses: the model's own, one given, or UTF-8 bytes (:mod:`biasviz.extraction.tokens`)."""

from __future__ import annotations

import pytest

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.errors import BiasvizError
from biasviz.extraction.tokens import byte_level_tokenizer, resolve_tokenizer
from tests.conftest import small_model


def test_byte_level_tokenizer_fallback():
    tok = byte_level_tokenizer(300)
    assert tok.encode("aé\n").ids == list("aé\n".encode())
    assert tok.token_to_id("<|endoftext|>") == 256
    small = BiasGPTAdapter(small_model("alibi"), source="/m/x.pt")  # vocabulary 97 < 256 bytes
    with pytest.raises(BiasvizError, match="--tokenizer"):
        resolve_tokenizer(small, None)
    big = BiasGPTAdapter(small_model("alibi", vocab_size=300), source="/m/x.pt")
    big.vocab_size = 300
    with pytest.warns(UserWarning, match="UTF-8 bytes"):
        _, desc = resolve_tokenizer(big, None)
    assert desc.startswith("byte-level")
