"""Adapters for transformers' BLOOM, MPT, Falcon, T5 and GPT-2 against the libraries' own numbers.

Every model is a tiny random one built from its config class and saved to a temporary directory.
Three checks per architecture: the captured bias equals the library's own bias function; the captured
weights equal the library's ``output_attentions`` under eager attention; and softmax(q.k scaled +
captured bias + causal mask), with q and k taken from the layer's own projections, gives those weights
back, so the bias is exactly the term the model added.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from biasviz.adapters.base import KEY_POSITION, RELATIVE
from biasviz.adapters.transformers_models import (
    HF_ARCHITECTURES,
    SUPPORTED,
    FalconAdapter,
    describe,
    load_falcon,
    load_t5,
    weights_sha256,
)
from biasviz.common.errors import BiasvizError
from biasviz.extraction.full_matrices import full_matrices
from biasviz.schemes.alibi import interleaved_slopes
from biasviz.schemes.t5 import causal_bucket

B, T, H, VOCAB = 2, 24, 12, 64
LAYER = 1  # not the first: the bias must be the one passed on to later layers too


def _save(model: nn.Module, path: Path) -> Path:
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One saved random model per architecture (12 heads: the non-power-of-two ALiBi slope rule)."""
    from transformers import (
        BloomConfig,
        BloomForCausalLM,
        FalconConfig,
        FalconForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        MptConfig,
        MptForCausalLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf")
    falcon = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=H,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=False,
        parallel_attn=False,
        bias=True,
    )
    t5 = T5Config(
        vocab_size=VOCAB,
        d_model=48,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=H,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
    )
    return {
        "bloom": _save(
            BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=H)), root / "bloom"
        ),
        "mpt": _save(
            MptForCausalLM(MptConfig(vocab_size=VOCAB, d_model=48, n_layers=2, n_heads=H, max_seq_len=40)), root / "mpt"
        ),
        "falcon": _save(FalconForCausalLM(FalconConfig(**falcon)), root / "falcon"),
        "falcon_rope": _save(FalconForCausalLM(FalconConfig(**{**falcon, "alibi": False})), root / "falcon_rope"),
        "t5": _save(T5ForConditionalGeneration(t5), root / "t5"),
        "gpt2": _save(
            GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=H, n_positions=64)), root / "gpt2"
        ),
    }


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))  # (B, T)


def _load(dirs: dict[str, Path], model_type: str, **kwargs: object):
    import json

    assert json.loads((dirs[model_type] / "config.json").read_text())["model_type"] == model_type
    return HF_ARCHITECTURES[model_type](dirs[model_type], None, **kwargs)


def _capture(adapter, ids: torch.Tensor, qk: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None):
    """Captured bias and weights of LAYER, and (with ``qk``) the layer's scaled q.k scores (B, H, T, T)."""
    seen: dict[str, torch.Tensor] = {}
    handle = None
    if qk is not None:
        attn = adapter.attention(LAYER)
        handle = attn.register_forward_hook(lambda mod, args, out: seen.__setitem__("scores", qk(mod, args[0])))
    try:
        with full_matrices(adapter, [LAYER]) as cap:
            adapter.forward(ids)
    finally:
        if handle is not None:
            handle.remove()
    return cap.bias.get(LAYER), cap.weights[LAYER], seen.get("scores")


def _causal_softmax(scores: torch.Tensor, causal: bool = True) -> torch.Tensor:
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def _assert_row_constant_shift(bias: torch.Tensor, slopes: torch.Tensor, atol: float = 1e-5) -> None:
    """bias - (-m_h * (i - j)) is one constant per (head, query row) over the causal cells."""
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T) i - j
    shift = bias - (-slopes[:, None, None] * d)  # (H, T, T)
    causal = d >= 0
    for i in range(T):
        row = shift[:, i][:, causal[i]]  # (H, i + 1)
        torch.testing.assert_close(row, row[:, :1].expand_as(row), atol=atol, rtol=0)
    normalized = bias - bias.diagonal(dim1=-2, dim2=-1)[..., :, None]  # diagonal normalization
    torch.testing.assert_close(normalized[:, causal], (-slopes[:, None, None] * d)[:, causal], atol=atol, rtol=0)


def _assert_weights(weights: torch.Tensor, library: torch.Tensor, causal: bool = True) -> None:
    torch.testing.assert_close(weights, library, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T), atol=1e-5, rtol=0)
    if causal:
        assert weights[..., torch.ones(T, T, dtype=torch.bool).triu(1)].abs().max() == 0


# --------------------------------------------------------------------------------------------------- BLOOM


def _bloom_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = mod._reshape(mod.query_key_value(hidden))  # (B, H, T, hd) each
    return q @ k.transpose(-1, -2) * mod.inv_norm_factor


def test_bloom_bias_is_build_alibi_tensor_and_weights_are_output_attentions(dirs, ids) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    adapter = _load(dirs, "bloom")
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("alibi", "bloom", KEY_POSITION)
    assert (adapter.n_layers, adapter.n_heads, adapter.max_length, adapter.causal) == (2, H, None, True)
    bias, weights, scores = _capture(adapter, ids, _bloom_qk)
    assert bias.shape == weights.shape == (B, H, T, T)

    library = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), H, torch.float32)  # (B*H, 1, T)
    torch.testing.assert_close(bias, library.view(B, H, 1, T).expand(B, H, T, T), atol=0, rtol=0)
    slopes = bias[0, :, 0, 1]  # m_h * j at j = 1
    torch.testing.assert_close(slopes, torch.tensor(interleaved_slopes(H)), atol=1e-7, rtol=0)
    _assert_row_constant_shift(bias[0], slopes)

    with torch.no_grad():
        out = adapter.model(ids, output_attentions=True)
    _assert_weights(weights, out.attentions[LAYER])
    torch.testing.assert_close(_causal_softmax(scores + bias), weights, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------- MPT


def _mpt_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = (x.view(B, T, H, -1).transpose(1, 2) for x in mod.Wqkv(hidden).chunk(3, dim=2))  # (B, H, T, hd)
    return q @ k.transpose(-1, -2) * mod.softmax_scale


def test_mpt_bias_is_its_alibi_corner_and_weights_are_output_attentions(dirs, ids) -> None:
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    adapter = _load(dirs, "mpt")
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("alibi", "mpt", KEY_POSITION)
    assert (adapter.n_layers, adapter.n_heads, adapter.max_length) == (2, H, 40)
    bias, weights, scores = _capture(adapter, ids, _mpt_qk)
    assert bias.shape == (1, H, T, T)

    library = build_mpt_alibi_tensor(H, 40)  # (H, 1, max_seq_len): m_h * (j' - 39)
    torch.testing.assert_close(bias[0], library[:, :, -T:].expand(H, T, T), atol=0, rtol=0)
    # its slopes (alibi_bias_max 8) are Press et al.'s, and the whole matrix is shifted by -m_h * (T - 1)
    slopes = torch.tensor(interleaved_slopes(H))
    torch.testing.assert_close(bias[0, :, 0], slopes[:, None] * (torch.arange(T) - (T - 1)), atol=1e-6, rtol=0)
    _assert_row_constant_shift(bias[0], slopes)

    with torch.no_grad():
        out = adapter.model(ids, output_attentions=True)
    _assert_weights(weights, out.attentions[LAYER])
    torch.testing.assert_close(_causal_softmax(scores + bias), weights, atol=1e-6, rtol=1e-5)


# -------------------------------------------------------------------------------------------------- Falcon


def _falcon_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = mod._split_heads(mod.query_key_value(hidden))  # (B, T, H, hd) each
    return q.transpose(1, 2) @ k.permute(0, 2, 3, 1) * mod.inv_norm_factor


def test_falcon_bias_is_build_alibi_tensor_scaled_and_weights_are_output_attentions(dirs, ids) -> None:
    from transformers import FalconModel
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    adapter = _load(dirs, "falcon")
    assert isinstance(adapter, FalconAdapter)
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("alibi", "falcon", KEY_POSITION)
    bias, weights, scores = _capture(adapter, ids, _falcon_qk)
    assert bias.shape == (B, H, T, T)

    inv_norm = 1 / math.sqrt(48 // H)  # Falcon adds alibi before scaling q.k by 1/sqrt(d_head)
    library = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), H, torch.float32)  # (B*H, 1, T), bfloat16 math
    torch.testing.assert_close(bias, (library * inv_norm).view(B, H, 1, T).expand(B, H, T, T), atol=0, rtol=0)
    # a function of the key alone (the same in every row), m_h * j up to Falcon's bfloat16 rounding, which
    # leaves it not exactly linear in j: diagonal normalization gives -m_h * (i - j) to bfloat16 precision only
    assert torch.equal(bias, bias[:, :, :1].expand_as(bias))
    exact = torch.tensor(interleaved_slopes(H))[:, None] * torch.arange(T) * inv_norm  # (H, T)
    torch.testing.assert_close(bias[0, :, 0], exact, atol=0, rtol=2**-7)
    assert not torch.equal(bias[0, :, 0], exact)

    with torch.no_grad():
        out = adapter.model(ids, output_attentions=True)
        sdpa = FalconModel.from_pretrained(dirs["falcon"], attn_implementation="sdpa", local_files_only=True).eval()
        reference = sdpa(ids).last_hidden_state
    _assert_weights(weights, out.attentions[LAYER])
    torch.testing.assert_close(_causal_softmax(scores + bias), weights, atol=1e-6, rtol=1e-5)
    # the eager forward the weights come from agrees with the model's default (SDPA) forward
    torch.testing.assert_close(out.last_hidden_state, reference, atol=1e-5, rtol=1e-5)


def test_falcon_eager_without_repair_adds_alibi_twice(dirs, ids) -> None:
    """Pins the transformers behaviour the repair exists for: fails once the library adds ALiBi once."""
    adapter = load_falcon(dirs["falcon"], repair_eager_alibi=False)
    bias, weights, scores = _capture(adapter, ids, _falcon_qk)
    torch.testing.assert_close(_causal_softmax(scores + 2 * bias), weights, atol=1e-6, rtol=1e-5)


def test_falcon_with_rotary_embeddings_is_traced_like_any_rope_model(dirs, ids, tmp_path) -> None:
    """``alibi: false`` adds no bias: the model is traced, and the weights of every call are the eager model's own
    ``output_attentions``."""
    from transformers import FalconForCausalLM

    import biasviz
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.store import open_bias_file

    adapter = load_falcon(dirs["falcon_rope"])
    assert isinstance(adapter, TracedAdapter) and type(adapter.model) is FalconForCausalLM
    out = tmp_path / "falcon-rope.h5"
    biasviz.extract(dirs["falcon_rope"], ids.numpy(), out, layers="all", progress=False)
    eager = FalconForCausalLM.from_pretrained(dirs["falcon_rope"], attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = eager(ids, output_attentions=True).attentions
    with open_bias_file(out) as f:
        assert list(f.layers) == [0, 1] and f.attrs["n_heads"] == H
        for layer in f.layers:
            torch.testing.assert_close(torch.from_numpy(f.read("weights", layer=layer)), attentions[layer],
                                       atol=1e-6, rtol=0)  # fmt: skip


# ------------------------------------------------------------------------------------------------------ T5


def _t5_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q = mod.q(hidden).view(B, T, H, -1).transpose(1, 2)  # (B, H, T, d_kv)
    k = mod.k(hidden).view(B, T, H, -1).transpose(1, 2)
    return q @ k.transpose(-1, -2)  # T5 does not scale q.k


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


def test_hooks_sit_on_the_captured_layer_only_and_leave_with_the_block(dirs, ids) -> None:
    adapter = _load(dirs, "bloom")
    modules = [adapter.attention(layer) for layer in range(adapter.n_layers)]
    calls: list[int] = []
    with full_matrices(adapter, [0], want_bias=False) as cap:
        assert [bool(m._forward_hooks) for m in modules] == [True, False]
        assert not any(m._forward_pre_hooks for m in modules)  # no bias wanted, no pre-hook
        handle = adapter.model.h[1].register_forward_pre_hook(lambda *_: calls.append(1))
        adapter.forward(ids)
        handle.remove()
    assert set(cap.weights) == {0} and not cap.bias
    assert calls == []  # the pass ended after the captured layer's attention
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in modules)
    adapter.forward(ids)  # outside capture the whole model runs again


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


# ----------------------------------------------------------------------------------------- scores (docs/positional.md)


def _gpt2_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = (x.view(B, T, H, -1).transpose(1, 2) for x in mod.c_attn(hidden).split(48, dim=2))
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


@pytest.mark.parametrize(("model_type", "qk"), [("bloom", _bloom_qk), ("mpt", _mpt_qk), ("falcon", _falcon_qk),
                                                ("t5", _t5_qk), ("gpt2", _gpt2_qk)])  # fmt: skip
def test_every_transformers_adapter_captures_the_scores_and_their_q_and_k(dirs, ids, model_type: str, qk) -> None:
    """The scores of the captured layer are the library's own scaled q·k (its modules, recomputed here) plus the
    bias the adapter captures, masked cells NaN; the call's q and k give the same product."""
    adapter = _load(dirs, model_type)
    assert adapter.captures_scores
    seen: dict[str, torch.Tensor] = {}
    attn = adapter.attention(LAYER)
    handle = attn.register_forward_hook(lambda mod, args, out: seen.__setitem__("qk", qk(mod, args[0])))
    try:
        with full_matrices(adapter, [LAYER], want_scores=True) as cap:
            adapter.forward(ids)
    finally:
        handle.remove()
    scores, bias = cap.scores[LAYER], cap.bias.get(LAYER)
    expected = seen["qk"] + (0.0 if bias is None else bias)
    kept = ~scores.isnan()
    if adapter.causal:
        assert bool((kept == torch.ones(T, T, dtype=torch.bool).tril()).all())
    torch.testing.assert_close(scores[kept], expected.expand_as(scores)[kept], atol=1e-5, rtol=1e-5)
    q, k, scale = cap.operands[LAYER]  # k multiplied by the call's scale, as the stream's blocks bring it
    assert scale > 0
    torch.testing.assert_close((q @ k.transpose(-1, -2))[kept], seen["qk"][kept], atol=1e-5, rtol=1e-5)
