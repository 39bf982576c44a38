"""transformers directories are loaded as what they hold (docs/hdf5.md, 'Attended cells'): the class config.json names,
every weight from the files, never one initialised at random (files that lie or would run code: test_files.py).

Every model is a tiny random one built from its config class and saved to a temporary directory; the references
are the saved tensors and the library's own eager ``output_attentions``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from biasviz.adapters import load_model
from biasviz.common.errors import BiasvizError
from tests.conftest import run_cli

V, T, N = 100, 12, 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny saved models: BART (1 encoder, 2 decoder layers), GPT-2, Llama, and a vision model (ViT)."""
    import transformers as tf

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("loading")
    bart = tf.BartConfig(vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                         max_position_embeddings=32, dropout=0.0, attention_dropout=0.0)  # fmt: skip
    models = {
        "bart": tf.BartForConditionalGeneration(bart),
        "gpt2": tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=16, n_layer=1, n_head=2, n_positions=32)),
        "llama": tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=1, num_attention_heads=2,
                                                    num_key_value_heads=2)),  # fmt: skip
        "vit": tf.ViTModel(tf.ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=32, image_size=8, patch_size=4)),  # fmt: skip
    }
    dirs = {}
    for name, model in models.items():
        model.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A word-level tokenizer inside the tiny vocabulary, and a text in its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("text")
    words = [f"w{i}" for i in range(V - 1)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    rng = np.random.default_rng(0)
    (root / "text.txt").write_text(" ".join(words[i] for i in rng.integers(0, len(words), 300)))
    return root / "tokenizer.json", root / "text.txt"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _extract_args(model: Path, text: tuple[Path, Path], out: Path) -> list[str]:
    return ["extract", "--model", str(model), "--tokenizer", str(text[0]), "--text", str(text[1]), "--samples",
            str(N), "--seq-len", str(T), "--layer", "all", "--out", str(out), "--quiet", "--device", "cpu"]  # fmt: skip


# ------------------------------------------------------------------------------------------- encoder-decoder


def test_bart_loads_as_saved_and_every_call_is_traced(saved, tmp_path) -> None:
    """Loaded as BartForConditionalGeneration: every parameter equals the saved tensors (so two loads agree), and the
    traced weights of the encoder, decoder self- and cross-attention calls are the eager model's own, its decoder
    fed the ids shifted right behind the start token (what BART's forward builds when given no decoder ids)."""
    from safetensors.torch import load_file
    from transformers import BartForConditionalGeneration

    import biasviz
    from biasviz.store import open_bias_file

    adapter = load_model(saved["bart"])
    model = adapter.model
    assert type(model) is BartForConditionalGeneration
    files = load_file(str(saved["bart"] / "model.safetensors"))
    state = model.state_dict()
    for name, tensor in files.items():
        assert torch.equal(state[name], tensor), name
    for name, tensor in state.items():  # weights tied on purpose are the saved ones too
        if name not in files:
            assert any(torch.equal(tensor, f) for f in files.values()), name

    ids = torch.randint(3, V, (N, T), generator=torch.Generator().manual_seed(1))
    out = tmp_path / "bart.h5"
    biasviz.extract(saved["bart"], ids.numpy(), out, layers="all", progress=False)
    eager = BartForConditionalGeneration.from_pretrained(saved["bart"], attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(input_ids=ids, output_attentions=True)  # decoder_input_ids: BART's own shifted ids
    order = [ref.encoder_attentions[0], ref.decoder_attentions[0], ref.cross_attentions[0],
             ref.decoder_attentions[1], ref.cross_attentions[1]]  # the order the model calls attention  # fmt: skip
    with open_bias_file(out) as f:
        assert list(f.layers) == list(range(len(order)))
        for call, expected in enumerate(order):
            got = torch.from_numpy(f.read("weights", layer=call))
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_bart_summary_takes_each_call_by_its_own_mask(saved, tmp_path) -> None:
    """A summary of every call: the encoder and cross attention over every cell, the decoder's self-attention
    causally (cells after the query NaN); each map the mean over samples of the eager model's own weights."""
    import h5py
    from transformers import BartForConditionalGeneration

    import biasviz

    ids = torch.randint(3, V, (3, T), generator=torch.Generator().manual_seed(2))
    out = tmp_path / "bart-summary.h5"
    biasviz.extract(saved["bart"], ids.numpy(), out, layers="all", summary=True, resolution=T, progress=False)
    eager = BartForConditionalGeneration.from_pretrained(saved["bart"], attn_implementation="eager").eval()
    with torch.no_grad():
        ref = eager(input_ids=ids, output_attentions=True)
    order = [ref.encoder_attentions[0], ref.decoder_attentions[0], ref.cross_attentions[0]]
    after = torch.ones(T, T, dtype=torch.bool).triu(1)
    with h5py.File(out) as f:
        for call, expected in enumerate(order):
            got = torch.from_numpy(f[f"layer_{call}/weights_mean"][()])  # (head, query, key)
            mean = expected.mean(0)
            if call == 1:
                assert bool(got[:, after].isnan().all())
                got, mean = got[:, ~after], mean[:, ~after]
            torch.testing.assert_close(got, mean, atol=1e-6, rtol=0)
        # the decoder's causal rule travels with its layer: the reader takes its maps as they are
        assert f.attrs["mask"] == "model" and not f.attrs["causal"]
        assert np.array_equal(f["layer_1/attended"][0], np.tril(np.ones((T, T))))
    from biasviz.store import open_bias_file

    with open_bias_file(out) as bf:
        read = bf.summary_map("weights_mean", 1)  # validated: before, "damaged" (NaN in blocks with cells)
    assert np.isnan(read[:, after.numpy()]).all() and np.isfinite(read[:, ~after.numpy()]).all()


def test_bart_cli_runs_are_reproducible(saved, text, tmp_path, capsys) -> None:
    """Two runs of one command store the same weights (no head or embedding drawn at random on load)."""
    from biasviz.store import open_bias_file

    runs = []
    for k in range(2):
        code, _, err = run_cli(_extract_args(saved["bart"], text, tmp_path / f"{k}.h5"), capsys)
        assert code == 0, err
        with open_bias_file(tmp_path / f"{k}.h5") as f:
            runs.append([f.read("weights", layer=c) for c in f.layers])
    assert len(runs[0]) == 5
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(a, b)


def test_part_on_a_traced_encoder_decoder_points_to_layer(saved, text, tmp_path, capsys) -> None:
    code, _, err = run_cli([*_extract_args(saved["bart"], text, tmp_path / "x.h5"), "--part", "decoder"], capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "encoder-decoder, traced whole" in lines[0] and "--layer" in lines[0]


# -------------------------------------------------------------------------------------- weights that do not fit


def test_llama_weights_under_a_gpt2_config_are_refused(saved, text, tmp_path, capsys) -> None:
    import transformers as tf

    target = _copy(saved["llama"], tmp_path / "lying")
    config = tf.GPT2Config(vocab_size=V, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    (target / "config.json").write_text(config.to_json_string())
    code, out, err = run_cli(_extract_args(target, text, tmp_path / "x.h5"), capsys)
    assert code == 1 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), err
    assert "h.0.attn.c_attn.weight" in lines[0] and "16 weights are missing" in lines[0]
    assert not (tmp_path / "x.h5").exists()
    with pytest.raises(ValueError, match="h.0.attn.c_attn.weight") as raised:  # the Python API
        load_model(target)
    assert isinstance(raised.value, BiasvizError)


def test_gpt2_weights_under_a_mistral_config_are_refused_on_the_traced_path(saved, tmp_path) -> None:
    """An architecture with no adapter, traced: the auto classes are tried, none fits, the error names a weight."""
    import transformers as tf

    target = _copy(saved["gpt2"], tmp_path / "lying")
    config = tf.MistralConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    (target / "config.json").write_text(config.to_json_string())
    with pytest.raises(BiasvizError, match=r"loaded as MistralModel, 11 weights are missing .*embed_tokens\.weight"):
        load_model(target)


def test_weights_of_layers_the_config_leaves_out_are_refused(tmp_path) -> None:
    """Two layers saved, a config of one: the second layer's weights would be dropped without a word."""
    import transformers as tf

    torch.manual_seed(0)
    tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=V, n_embd=16, n_layer=2, n_head=2, n_positions=32)).save_pretrained(
        tmp_path / "two")
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    (tmp_path / "two" / "config.json").write_text(json.dumps({**config, "n_layer": 1}))
    with pytest.raises(BiasvizError, match=r"have no place in the model .*h\.1\.attn\.c_attn\.weight"):
        load_model(tmp_path / "two")


def test_a_tied_head_is_not_missing(saved) -> None:
    """GPT-2 ties its head to the embedding on purpose: the head is not saved, and not reported missing."""
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    from biasviz.adapters.loading import load_checked

    assert "lm_head.weight" not in load_file(str(saved["gpt2"] / "model.safetensors"))
    model = load_checked(GPT2LMHeadModel, saved["gpt2"])
    assert model.lm_head.weight is model.transformer.wte.weight
    assert load_model(saved["gpt2"]).architecture == "gpt2"


# ------------------------------------------------------------------------------------------------- not text


def test_a_vision_model_with_a_tokenizer_is_one_error_line(saved, text, tmp_path, capsys) -> None:
    target = _copy(saved["vit"], tmp_path / "vit")
    shutil.copy(text[0], target / "tokenizer.json")
    args = _extract_args(target, text, tmp_path / "x.h5")
    code, _, err = run_cli(args[:3] + args[5:], capsys)  # the directory's own tokenizer
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("Error:") and "takes pixel_values, not token ids" in lines[0]
