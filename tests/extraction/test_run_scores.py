"""``extract --capture bias,weights,scores``: full files with the softmax's input (docs/positional.md).

The scores are compared with scale·q·k + b computed in numpy float64 from the model's own q and k (read at
``hook_q``/``hook_k``, or for a traced Llama from its ``q_proj``/``k_proj`` rotated by transformers' own
function) and the stored bias; masked cells are NaN, as the bias's are.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.errors import BiasvizError
from biasviz.extraction.run import extract
from biasviz.model import capture
from tests.cli.test_extract_cmd import TEXT, extract_args, run
from tests.conftest import small_model

T = 32
LOWER = np.tril(np.ones((T, T), bool))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CABLE checkpoint (vocabulary 300) with its tokenizer, and a text file."""
    from biasviz.data import build_tokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("ck")
    small_model("cable", vocab_size=300).save_pretrained(root / "cable")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "cable")
    (root / "text.txt").write_text(TEXT)
    return root


def _windows(n: int = 3) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 97, size=(n, T))


@pytest.mark.parametrize("scheme", ["alibi", "cable", "rope", "fire"])
def test_scores_are_scale_q_k_plus_the_bias(tmp_path: Path, scheme: str) -> None:
    model = small_model(scheme)
    ids = _windows()
    got: dict[str, torch.Tensor] = {}
    with capture(model, ["blocks.1.attn.hook_q", "blocks.1.attn.hook_k"],
                 lambda t, n, _r: got.update({n[-1]: t})), torch.no_grad():  # fmt: skip
        model(torch.from_numpy(ids))
    q, k = (got[x].double().numpy().transpose(0, 2, 1, 3) for x in ("q", "k"))  # (N, H, T, hd)
    adapter = BiasGPTAdapter(model, source="test")
    extract(adapter, ids, tmp_path / "plain.h5", layers=[1], device="cpu", progress=False)
    extract(adapter, ids, tmp_path / "s.h5", layers=[1], device="cpu", progress=False, batch_size=2,
            capture=["bias", "weights", "scores"])  # fmt: skip
    with h5py.File(tmp_path / "s.h5") as f, h5py.File(tmp_path / "plain.h5") as plain:
        g = f["layer_1"]
        bias = np.nan_to_num(np.broadcast_to(g["bias"][()], g["weights"].shape)) if "bias" in g else 0.0
        want = model.blocks[1].attn.scale * np.einsum("ahid,ahjd->ahij", q, k) + bias
        want[..., ~LOWER] = np.nan
        np.testing.assert_allclose(g["scores"][()], want, rtol=1e-5, atol=1e-5, equal_nan=True)
        np.testing.assert_array_equal(g["weights"][()], plain["layer_1/weights"][()])  # the same weights as before
        assert g["scores"].dims[0].label == "sample" and g["scores"].dims[3].label == "key"


def test_traced_llama_scores_are_its_rotated_q_k(tmp_path: Path) -> None:
    import biasviz
    from tests.summaries.test_position_traced import _reference

    path = tmp_path / "llama"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 rope_theta=500.0)).save_pretrained(path)  # fmt: skip
    ids = np.random.default_rng(1).integers(0, 100, size=(3, 64))
    r = _reference(path, ids, layer=1)
    biasviz.extract(str(path), ids, tmp_path / "s.h5", layers=[1], device="cpu", progress=False,
                    capture="bias,weights,scores")  # fmt: skip
    want = r["scale"] * np.einsum("ahid,ahjd->ahij", r["q"], r["k"])
    want[..., ~np.tril(np.ones((64, 64), bool))] = np.nan
    with h5py.File(tmp_path / "s.h5") as f:
        np.testing.assert_allclose(f["layer_1/scores"][()], want, rtol=1e-5, atol=1e-5, equal_nan=True)
        assert "layer_1/bias" not in f


def test_cli_capture_scores_and_read_back(ckpt: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "c.h5"
    code, stdout, err = run(extract_args(ckpt, "--capture", "bias,weights,scores", "--out", str(out)), capsys)
    assert code == 0, err
    assert "bias, weights and scores" in stdout
    from biasviz.store import open_bias_file

    with open_bias_file(out) as f:
        assert f.has_scores() and f.read("scores", sample=0).shape == (f.n_heads, 24, 24)
        assert np.isnan(f.read("scores", sample=0)[0, 0, 1])  # after the query: NaN, as the bias
    code, _, _ = run(["info", str(out)], capsys)
    assert code == 0


@pytest.mark.parametrize(("extra", "message"), [
    (["--capture", "weights,logits"], "unknown name(s) 'logits'"),
    (["--capture", "bias,scores"], "the weights are always stored"),
    (["--capture", ""], "the weights are always stored"),
    (["--capture", "bias,weights,scores", "--summary"], "--capture applies to full files"),
])  # fmt: skip
def test_bad_capture_is_one_error_line_and_nothing_written(ckpt: Path, tmp_path: Path, capsys, extra: list[str],
                                                           message: str) -> None:  # noqa: ANN001
    code, _, err = run(extract_args(ckpt, *extra, "--out", str(tmp_path / "x.h5")), capsys)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_transformers_adapter_stores_scores_and_one_that_cannot_says_so(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """GPT-2's hooks see no scores, its traced forward does: c·q·k from its own c_attn; an adapter that forms
    none (a user's ModelAdapter, say) is one clear error."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from biasviz.adapters import load_model

    config = GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    adapter = load_model(tmp_path / "gpt2")
    windows = _windows()
    extract(adapter, windows, tmp_path / "x.h5", device="cpu", progress=False, capture=["weights", "scores"])
    model = adapter.model  # GPT2Model: no language-model head
    with torch.no_grad():
        hidden = model.wte(torch.from_numpy(windows)) + model.wpe.weight[: windows.shape[1]]
        q, k, _ = model.h[0].attn.c_attn(model.h[0].ln_1(hidden)).double().split(32, dim=2)
        q, k = (x.view(*windows.shape, 2, 16).transpose(1, 2) for x in (q, k))
        want = (q @ k.transpose(-1, -2) / 4.0).numpy()
    t = windows.shape[1]
    want[..., ~np.tril(np.ones((t, t), bool))] = np.nan
    with h5py.File(tmp_path / "x.h5") as f:
        np.testing.assert_allclose(f["layer_0/scores"][()], want, rtol=1e-5, atol=1e-5, equal_nan=True)
    monkeypatch.setattr(adapter, "captures_scores", False)
    with pytest.raises(BiasvizError, match="does not form the scores"):
        extract(adapter, windows, tmp_path / "y.h5", device="cpu", progress=False, capture=["weights", "scores"])
    assert not (tmp_path / "y.h5").exists()
