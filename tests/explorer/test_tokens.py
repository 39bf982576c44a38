"""The text of each token id on the page (:mod:`biasviz.explorer.tokens`), decoded when the file's tokenizer is
known."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from biasviz.explorer.build import build_page_data
from biasviz.explorer.tokens import token_strings


def test_tokens_are_decoded_when_the_tokenizer_is_known(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    from biasviz.data.tokenizer import build_tokenizer, save_tokenizer

    tok = build_tokenizer(["the cat sat on the mat. " * 20], vocab_size=300)
    tok_path = save_tokenizer(tok, tmp_path)
    ids = np.array([tok.encode("the cat sat on the mat. " * 12).ids[:64]] * 2, np.int32)
    src = make_bias_file(tmp_path / "t.h5", input_ids=ids, attrs={"tokenizer": str(tok_path)})
    tokens = build_page_data([src]).payload["tokens"]["A"]
    assert tokens["tokenizer"] == str(tok_path)
    assert tokens["strings"][str(ids[0, 1])] == tok.decode([int(ids[0, 1])])
    assert token_strings("bytes", [65]) == {65: "A"}
