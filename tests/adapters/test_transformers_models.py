"""Adapters for transformers' T5 and GPT-2 against the libraries' own numbers, and the table of what ``--model``
opens (:mod:`biasviz.adapters.transformers_models`; BLOOM, MPT and Falcon: test_transformers_alibi.py, what every
transformers adapter shares: test_transformers_base.py).

Every model is a tiny random one built from its config class and saved to a temporary directory
(tests/adapters/tiny_transformers.py). For T5: the captured bias equals the library's own ``compute_bias``; the
captured weights equal the library's ``output_attentions`` under eager attention; and softmax(q.k + captured
bias (+ causal mask)), with q and k taken from the layer's own projections, gives those weights back, so the bias
is exactly the term the model added.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from biasviz.adapters.base import RELATIVE
from biasviz.adapters.transformers_models import (
    HF_ARCHITECTURES,
    SUPPORTED,
    describe,
    load_t5,
    weights_sha256,
)
from biasviz.common.errors import BiasvizError
from biasviz.schemes.t5 import causal_bucket
from tests.adapters import tiny_transformers
from tests.adapters.tiny_transformers import (
    LAYER,
    VOCAB,
    H,
    T,
    _assert_weights,
    _capture,
    _causal_softmax,
    _load,
    _t5_qk,
)

dirs, ids = tiny_transformers.dirs, tiny_transformers.ids  # the saved models and the ids, fixtures of this file's own


# ------------------------------------------------------------------------------------------------------ T5


def test_t5_encoder_bias_is_bidirectional_compute_bias(dirs, ids) -> None:
    adapter = _load(dirs, "t5")
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("t5", "t5-encoder", RELATIVE)
    assert (adapter.n_layers, adapter.n_heads, adapter.causal) == (2, H, False)
    bias, weights, scores = _capture(adapter, ids, _t5_qk)
    assert bias.shape == (1, H, T, T)

    first = adapter.model.encoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        library = first.compute_bias(T, T)  # (1, H, T, T), bidirectional (encoder)
        out = adapter.model(ids, output_attentions=True)
    torch.testing.assert_close(bias, library, atol=0, rtol=0)
    assert not torch.equal(bias[0, :, 3, 5], bias[0, :, 5, 3])  # keys after the query have their own buckets

    _assert_weights(weights, out.attentions[LAYER], causal=False)
    torch.testing.assert_close(_causal_softmax(scores + bias, causal=False), weights, atol=1e-6, rtol=1e-5)


def test_t5_decoder_bias_is_unidirectional_compute_bias(dirs, ids) -> None:
    adapter = load_t5(dirs["t5"], "t5-bias", part="decoder")
    assert (adapter.architecture, adapter.n_layers, adapter.causal) == ("t5-decoder", 3, True)
    bias, weights, scores = _capture(adapter, ids, _t5_qk)

    first = adapter.model.decoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        library = first.compute_bias(T, T)  # (1, H, T, T), unidirectional (decoder)
        out = adapter.model(input_ids=ids, decoder_input_ids=ids, output_attentions=True)
    torch.testing.assert_close(bias, library, atol=0, rtol=0)
    # the t5 scheme (README's table): w[bucket(i - j), h] with T5's causal buckets
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    table = first.relative_attention_bias.weight.detach()  # (buckets, H)
    spec = table[causal_bucket(d, num_buckets=8, max_distance=16)].permute(2, 0, 1)  # (H, T, T)
    torch.testing.assert_close(bias[0][:, d >= 0], spec[:, d >= 0], atol=0, rtol=0)

    _assert_weights(weights, out.decoder_attentions[LAYER])
    torch.testing.assert_close(_causal_softmax(scores + bias), weights, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------------------- GPT-2


def test_gpt2_gives_weights_only(dirs, ids) -> None:
    adapter = _load(dirs, "gpt2")
    assert (adapter.scheme, adapter.architecture, adapter.max_length) == ("learned", "gpt2", 64)
    bias, weights, _ = _capture(adapter, ids)
    assert bias is None
    with torch.no_grad():
        out = adapter.model(ids, output_attentions=True)
    _assert_weights(weights, out.attentions[LAYER])


# ------------------------------------------------------------------------------------------------- shared


def test_provenance_and_scheme_checks(dirs) -> None:
    adapter = _load(dirs, "gpt2")
    expected = hashlib.sha256((dirs["gpt2"] / "model.safetensors").read_bytes()).hexdigest()
    assert adapter.sha256 == weights_sha256(dirs["gpt2"]) == expected
    assert adapter.source == str(dirs["gpt2"].resolve()) and adapter.tokenizer is None
    assert (adapter.adds_bias, adapter.context_dependent, adapter.vocab_size) == (False, False, VOCAB)
    assert '"model_type": "gpt2"' in adapter.config_json
    assert _load(dirs, "bloom").adds_bias
    with pytest.raises(BiasvizError, match="alibi"):
        HF_ARCHITECTURES["bloom"](dirs["bloom"], "kerple")
    with pytest.raises(BiasvizError, match="part"):
        load_t5(dirs["t5"], None, part="cross")


def test_tokenizer_is_read_from_the_directory(dirs, tmp_path) -> None:
    import shutil

    from tokenizers import Tokenizer, models

    target = tmp_path / "gpt2"
    shutil.copytree(dirs["gpt2"], target)
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(target / "tokenizer.json"))
    assert HF_ARCHITECTURES["gpt2"](target, None).tokenizer.encode("a").ids == [1]


def test_describe_lists_every_architecture() -> None:
    text = describe()
    assert len(text.splitlines()) == 2 + len(SUPPORTED)
    for name in ("BLOOM", "MPT", "Falcon", "T5", "GPT-2"):
        assert name in text
    assert {"bloom", "mpt", "falcon", "t5", "gpt2"} <= set(HF_ARCHITECTURES)


def _word_tokenizer(path: Path, n_words: int) -> tuple[Path, Path]:
    """A word-level tokenizer small enough for the tiny models' vocabulary, and a text in its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(n_words - 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    gen = torch.Generator().manual_seed(0)
    text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (400,), generator=gen))
    (path / "text.txt").write_text(text)
    return path / "tokenizer.json", path / "text.txt"


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_cli_extracts_either_t5_stack(dirs, tmp_path, part: str) -> None:
    from biasviz.cli import main
    from biasviz.store import open_bias_file

    tok, text = _word_tokenizer(tmp_path, VOCAB)
    out = tmp_path / f"t5-{part}.h5"
    main(["extract", "--model", str(dirs["t5"]), "--part", part, "--tokenizer", str(tok), "--text", str(text),
          "--samples", "2", "--seq-len", "16", "--out", str(out), "--quiet", "--device", "cpu"])  # fmt: skip
    with open_bias_file(out) as f:
        assert f.scheme == "t5" and f.attrs["architecture"] == f"t5-{part}"
        bias = f.read("bias", sample=0)  # (H, T, T)
        upper = ~torch.tril(torch.ones(16, 16, dtype=torch.bool)).numpy()
        # the encoder attends both ways, so its upper triangle is real data; the decoder's is masked
        assert bool(torch.isnan(torch.from_numpy(bias[:, upper])).all()) == (part == "decoder")


def test_cli_part_is_refused_for_single_stack_models(dirs, tmp_path, capsys) -> None:
    from biasviz.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["extract", "--model", str(dirs["bloom"]), "--part", "decoder", "--out", str(tmp_path / "x.h5")])
    assert exit_info.value.code == 1
    assert "--part applies to encoder-decoder models" in capsys.readouterr().err
