"""A transformers directory with no adapter of its own (:mod:`biasviz.adapters.transformers_traced`): the class its
config names, in float32, SDPA attention or eager where the config softcaps the logits; an encoder-decoder's decoder
fed the ids shifted right as BART's own ``shift_tokens_right`` shifts them; a model that takes no token ids refused;
the name its files carry.

Every model is a tiny random one built from its config class and saved to a temporary directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from biasviz.adapters.transformers_traced import (
    TransformersSdpaAdapter,
    decoder_ids,
    decoder_start,
    load_transformers_sdpa,
    traced_name,
)
from biasviz.common.errors import BiasvizError

V = 50


@pytest.mark.parametrize(("kind", "folder", "name"), [
    ("llama", "x", "llama"), ("../../etc", "x", "etc"), ("", "my model", "my_model"), ("", ".hidden", "hidden"),
    ("/", "..", "traced"), ("a/b\\c", "d", "a_b_c"),
])  # fmt: skip
def test_a_traced_name_is_one_safe_file_name(kind: str, folder: str, name: str, tmp_path: Path) -> None:
    got = traced_name(kind, tmp_path / folder if folder != ".." else Path("/"))
    assert got == name
    assert "/" not in got and "\\" not in got and not got.startswith(".")


# --- an encoder-decoder's decoder input --------------------------------------------------------------------------
@pytest.mark.parametrize("start", [0, 2, 7])
def test_decoder_ids_are_bart_s_own_shift_right(start: int) -> None:
    from transformers.models.bart.modeling_bart import shift_tokens_right

    ids = torch.randint(3, V, (3, 9), generator=torch.Generator().manual_seed(start))
    before = ids.clone()
    got = decoder_ids(ids, start)
    assert torch.equal(got, shift_tokens_right(before, pad_token_id=1, decoder_start_token_id=start))
    assert got.dtype == ids.dtype and torch.equal(ids, before)  # the ids themselves are left as they were


def test_the_decoder_starts_from_its_start_token_else_the_pad_token(tmp_path: Path) -> None:
    assert decoder_start(SimpleNamespace(decoder_start_token_id=2, pad_token_id=1), tmp_path) == 2
    assert decoder_start(SimpleNamespace(decoder_start_token_id=None, pad_token_id=0), tmp_path) == 0  # T5's
    assert decoder_start(SimpleNamespace(pad_token_id=5), tmp_path) == 5
    with pytest.raises(BiasvizError, match=r"config\.json names no decoder_start_token_id \(nor pad_token_id\)"):
        decoder_start(SimpleNamespace(decoder_start_token_id=None, pad_token_id=None), tmp_path)


def test_an_encoder_decoder_runs_whole_its_decoder_fed_the_shifted_ids(tmp_path: Path) -> None:
    import transformers as tf
    from transformers.models.bart.modeling_bart import shift_tokens_right

    config = tf.BartConfig(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                           max_position_embeddings=32, decoder_start_token_id=2, pad_token_id=1)  # fmt: skip
    torch.manual_seed(0)
    tf.BartForConditionalGeneration(config).save_pretrained(tmp_path / "bart")
    adapter = load_transformers_sdpa(tmp_path / "bart")
    seen: list[dict] = []
    adapter.model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs), with_kwargs=True)
    ids = torch.randint(3, V, (2, 10), generator=torch.Generator().manual_seed(1))
    adapter.forward(ids)
    (kwargs,) = seen
    assert torch.equal(kwargs["input_ids"], ids) and kwargs["use_cache"] is False
    assert torch.equal(kwargs["decoder_input_ids"], shift_tokens_right(ids, 1, 2))


# --- loading -----------------------------------------------------------------------------------------------------
def _llama(directory: Path, **extra: object) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=32, **extra)  # fmt: skip
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def test_a_directory_loads_as_the_class_it_names_in_float32_with_sdpa(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    directory = _llama(tmp_path / "my llama")
    adapter = load_transformers_sdpa(directory)
    model = adapter.model
    assert type(model) is LlamaForCausalLM and model.config._attn_implementation == "sdpa" and not model.training
    saved = load_file(str(directory / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    state = model.state_dict()
    for name, tensor in saved.items():  # saved in bfloat16, run in float32: the same values, widened
        assert state[name].dtype == torch.float32 and torch.equal(state[name], tensor.float()), name
    assert adapter.scheme == "llama"  # named by its architecture when no --scheme names it
    assert adapter.source == str(directory.resolve())
    assert adapter.sha256 == hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads(adapter.config_json) == json.loads((directory / "config.json").read_text())
    assert adapter.tokenizer is None and adapter.architecture == "LlamaForCausalLM"
    assert load_transformers_sdpa(directory, "rope").scheme == "rope"


def test_a_config_that_softcaps_the_logits_is_loaded_eager(tmp_path: Path) -> None:
    """Softcapping has no SDPA form: a config.json that names ``attn_logit_softcapping`` (Gemma2's key) is loaded
    eager, even for a class that SDPA would load (Gemma2's own class refuses SDPA in transformers itself)."""
    directory = _llama(tmp_path / "capped", attn_logit_softcapping=50.0)
    assert json.loads((directory / "config.json").read_text())["attn_logit_softcapping"] == 50.0
    assert load_transformers_sdpa(directory).model.config._attn_implementation == "eager"
    assert load_transformers_sdpa(_llama(tmp_path / "plain")).model.config._attn_implementation == "sdpa"


def test_a_model_that_takes_no_token_ids_is_refused(tmp_path: Path) -> None:
    from transformers import ViTConfig, ViTModel

    ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                       image_size=8, patch_size=4)).save_pretrained(tmp_path / "vit")  # fmt: skip
    with pytest.raises(BiasvizError, match=r"'vit' model \(ViTModel\), which takes pixel_values, not token ids"):
        load_transformers_sdpa(tmp_path / "vit")


def test_the_traced_adapter_opens_any_directory_with_a_config(tmp_path: Path) -> None:
    (tmp_path / "with").mkdir()
    (tmp_path / "with" / "config.json").write_text(json.dumps({"model_type": "made-up"}))
    (tmp_path / "without").mkdir()
    (tmp_path / "config.json").write_text("{}")
    assert TransformersSdpaAdapter.can_open(tmp_path / "with")
    assert not TransformersSdpaAdapter.can_open(tmp_path / "without")
    assert not TransformersSdpaAdapter.can_open(tmp_path / "config.json")  # a file, not a directory


def test_xglm_s_heads_folded_into_the_batch_are_its_heads(tmp_path: Path) -> None:
    """XGLM's attention (fairseq's) multiplies q and k with the heads folded into the batch and takes the softmax over
    (B·H, T, T); a full file and a summary (every cell, rows formed again from the kept q and k) hold its 4 heads as
    transformers' own output_attentions gives them, each sample its own."""
    import h5py
    import numpy as np
    from transformers import XGLMConfig, XGLMForCausalLM

    import biasviz

    torch.manual_seed(0)
    config = XGLMConfig(vocab_size=128, d_model=32, ffn_dim=64, num_layers=2, attention_heads=4,
                        max_position_embeddings=64)  # fmt: skip
    XGLMForCausalLM(config).save_pretrained(tmp_path / "xglm")
    tokens = np.random.default_rng(0).integers(3, 120, size=(3, 16))
    biasviz.extract(tmp_path / "xglm", tokens, tmp_path / "full.h5", layers="all", progress=False)
    biasviz.extract(tmp_path / "xglm", tokens, tmp_path / "sum.h5", layers="all", summary=True, resolution=16,
                    progress=False)  # fmt: skip
    model = XGLMForCausalLM.from_pretrained(tmp_path / "xglm", attn_implementation="eager").eval()
    with torch.no_grad():
        want = [a.double().numpy() for a in model(torch.from_numpy(tokens), output_attentions=True).attentions]
    causal = np.tril(np.ones((16, 16), dtype=bool))
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summary:
        for layer in range(2):
            np.testing.assert_allclose(full[f"layer_{layer}/weights"][...], want[layer], rtol=0, atol=1e-6)
            mean = summary[f"layer_{layer}/weights_mean"][...]
            np.testing.assert_allclose(mean[:, causal], want[layer].mean(0)[:, causal], rtol=0, atol=1e-6)


def test_an_encoder_decoder_with_a_bias_keeps_each_call_s_own_rule(tmp_path: Path) -> None:
    """UMT5 adds its relative bias in every self-attention: the encoder's see every key, the decoder's only keys up
    to the query, and cross attention adds nothing. A full file of every call holds each call as transformers' eager
    ``output_attentions`` gives it (the encoder's calls, then each decoder layer's self and cross attention), the
    decoder's bias as the model's own ``compute_bias``, NaN past the query; a summary the same means; plots and
    diagnostics read each layer by its own rule. (Before: "the captured bias of layer 2 contains NaN or infinite
    values", and the summary a TypeError.)"""
    import h5py
    import numpy as np
    import transformers as tf

    import biasviz
    from biasviz.store import open_bias_file

    config = tf.UMT5Config(vocab_size=V, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
                           decoder_start_token_id=0, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    tf.UMT5ForConditionalGeneration(config).save_pretrained(tmp_path / "umt5")
    ids = np.random.default_rng(0).integers(3, V, size=(3, 12))
    biasviz.extract(tmp_path / "umt5", ids, tmp_path / "full.h5", layers="all", progress=False)
    biasviz.extract(tmp_path / "umt5", ids, tmp_path / "sum.h5", layers="all", summary=True, resolution=12,
                    progress=False)  # fmt: skip
    model = tf.UMT5ForConditionalGeneration.from_pretrained(tmp_path / "umt5", attn_implementation="eager").eval()
    shifted = torch.from_numpy(np.hstack([np.zeros((3, 1), dtype=ids.dtype), ids[:, :-1]]))  # behind its start, 0
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), decoder_input_ids=shifted, output_attentions=True, use_cache=False)
    pairs = zip(out.decoder_attentions, out.cross_attentions, strict=True)
    calls = [*out.encoder_attentions, *(a for pair in pairs for a in pair)]
    above = np.triu(np.ones((12, 12), dtype=bool), 1)
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summary:
        for call, want in enumerate(calls):
            weights = full[f"layer_{call}/weights"][...]
            np.testing.assert_allclose(weights, want.numpy(), atol=1e-6)
            mean = summary[f"layer_{call}/weights_mean"][...]  # NaN where the call attends no cell (past the query)
            assert np.array_equal(np.isnan(mean), np.broadcast_to(above if call in (2, 4) else False, mean.shape))
            np.testing.assert_allclose(mean[~np.isnan(mean)], weights.mean(0)[~np.isnan(mean)], atol=1e-6)
        for call, block in ((2, model.decoder.block[0]), (4, model.decoder.block[1])):
            assert full[f"layer_{call}"].attrs["causal"]  # its own rule, in a file whose others see every key
            bias = full[f"layer_{call}/bias"][...]
            own = block.layer[0].SelfAttention.compute_bias(12, 12, device="cpu")[0].detach().numpy()
            assert np.isnan(bias[..., above]).all()
            np.testing.assert_allclose(bias[..., ~above], np.broadcast_to(own, bias.shape)[..., ~above], atol=1e-6)
        assert "causal" not in full["layer_1"].attrs and not full.attrs["causal"]
    with open_bias_file(tmp_path / "full.h5") as bf:
        assert [bf.layer_causal(layer) for layer in range(6)] == [False, False, True, False, True, False]
    fig = biasviz.plot(tmp_path / "full.h5", kind="bias", layer=2)  # a causal layer's NaN is its mask, not damage
    import matplotlib.pyplot as plt

    plt.close(fig)
    from click.testing import CliRunner

    from biasviz.cli import cli

    said = CliRunner().invoke(cli, ["info", str(tmp_path / "full.h5")]).output
    assert "layers 2, 4: causal" in said, said


def test_an_encoder_decoder_s_scores_keep_each_call_s_own_rule(tmp_path: Path) -> None:
    """BART's scores of every call (``--capture weights,scores``): the decoder's self-attention is causal, NaN past the
    query, beside calls that see every key; each call's weights the softmax of its scores over its own cells. (Before:
    "the captured scores of layer 1 contains NaN or infinite values".)"""
    import h5py
    import numpy as np
    import transformers as tf

    import biasviz

    config = tf.BartConfig(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                           decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                           max_position_embeddings=32, decoder_start_token_id=2, pad_token_id=1)  # fmt: skip
    torch.manual_seed(0)
    tf.BartForConditionalGeneration(config).save_pretrained(tmp_path / "bart")
    ids = np.random.default_rng(0).integers(3, V, size=(2, 10))
    biasviz.extract(tmp_path / "bart", ids, tmp_path / "f.h5", layers="all", capture="weights,scores", progress=False)
    above = np.triu(np.ones((10, 10), dtype=bool), 1)
    with h5py.File(tmp_path / "f.h5") as f:
        assert [bool(f[f"layer_{c}"].attrs.get("causal", f.attrs["causal"])) for c in range(3)] == [False, True, False]
        for call in range(3):
            scores, weights = f[f"layer_{call}/scores"][...], f[f"layer_{call}/weights"][...]
            rule = above if call == 1 else np.zeros_like(above)
            assert np.array_equal(np.isnan(scores), np.broadcast_to(rule, scores.shape))
            z = np.where(rule, -np.inf, scores.astype(np.float64))  # the weights are the softmax of the scores stored
            w = np.exp(z - z.max(-1, keepdims=True))
            np.testing.assert_allclose(weights, w / w.sum(-1, keepdims=True), rtol=0, atol=1e-6)
