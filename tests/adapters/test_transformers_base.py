"""What every transformers adapter shares (:mod:`biasviz.adapters.transformers_base`): hooks on the captured layers'
attention modules only, gone with the block, the pass ended after the last; the scores of every adapter with their
q and k, against the library's own modules; a key-position bias broadcast to every query row; the scheme a model
really uses; the facts read from its directory.

The tiny saved models and what their tests share are tests/adapters/tiny_transformers.py's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from biasviz.adapters.transformers_base import (
    TransformersAdapter,
    check_scheme,
    directory_facts,
    keys_to_query_rows,
    load_eager,
)
from biasviz.common.errors import BiasvizError
from biasviz.extraction.full_matrices import full_matrices
from tests.adapters import tiny_transformers
from tests.adapters.tiny_transformers import (
    LAYER,
    T,
    _bloom_qk,
    _falcon_qk,
    _gpt2_qk,
    _load,
    _mpt_qk,
    _t5_qk,
)

dirs, ids = tiny_transformers.dirs, tiny_transformers.ids  # the saved models and the ids, fixtures of this file's own


# --- hooks --------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------- scores (docs/positional.md)


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


# --- a bias of the key alone, the scheme, the directory -----------------------------------------------------------
@pytest.mark.parametrize(("n", "heads", "q_len", "k_len"), [(1, 3, 5, 5), (2, 4, 3, 7), (3, 2, 1, 4)])
def test_a_key_bias_is_every_query_rows_own_as_a_view(n: int, heads: int, q_len: int, k_len: int) -> None:
    row = torch.randn(n, heads, 1, k_len, generator=torch.Generator().manual_seed(k_len), requires_grad=True)
    got = keys_to_query_rows(row, q_len)
    expected = np.broadcast_to(row.detach().numpy(), (n, heads, q_len, k_len))
    assert got.shape == (n, heads, q_len, k_len) and np.array_equal(got.numpy(), expected)
    for i in range(q_len):  # every query row holds the key row, as numpy's broadcast does
        assert np.array_equal(got[:, :, i].numpy(), row.detach().numpy()[:, :, 0])
    assert not got.requires_grad and got.data_ptr() == row.data_ptr()  # a view: one key row per head in memory
    assert got.untyped_storage().nbytes() == row.untyped_storage().nbytes() == n * heads * k_len * 4


@pytest.mark.parametrize(("requested", "actual"), [(None, "alibi"), ("alibi", "alibi"), ("ALiBi", "alibi"),
                                                   ("t5-bias", "t5"), ("kerple", "kerple-log")])  # fmt: skip
def test_a_scheme_that_names_the_models_own_passes(requested: str | None, actual: str) -> None:
    check_scheme(requested, actual, "the model")


def test_a_scheme_the_model_does_not_use_is_refused() -> None:
    with pytest.raises(BiasvizError, match=r"^BLOOM uses the 'alibi' scheme; --scheme kerple does not apply"):
        check_scheme("kerple", "alibi", "BLOOM")
    with pytest.raises(BiasvizError, match="valid schemes"):
        check_scheme("xpos", "alibi", "BLOOM")


def test_the_facts_of_a_directory_are_read_from_its_files(tmp_path: Path) -> None:
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    real = tmp_path / "model"
    real.mkdir()
    save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(real / "model.safetensors"))
    (tmp_path / "link").symlink_to(real)
    facts = directory_facts(tmp_path / "link", 3, 4)
    assert facts["n_layers"] == 3 and facts["n_heads"] == 4 and facts["tokenizer"] is None
    assert facts["source"] == str(real.resolve())  # where the files are, not the link to them
    assert facts["sha256"] == hashlib.sha256((real / "model.safetensors").read_bytes()).hexdigest()
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(real / "tokenizer.json"))
    assert directory_facts(real, 3, 4)["tokenizer"].encode("a").ids == [1]


def test_an_adapter_opens_directories_of_its_model_types(tmp_path: Path) -> None:
    class MadeUp(TransformersAdapter):
        model_types = ("made-up", "other")

    for name, model_type in (("mine", "made-up"), ("also", "other"), ("theirs", "gpt2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "bare").mkdir()
    (tmp_path / "file.json").write_text(json.dumps({"model_type": "made-up"}))
    opens = sorted(p.name for p in tmp_path.iterdir() if MadeUp.can_open(p))
    assert opens == ["also", "mine"]


def test_a_directory_loads_eager_in_float32(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0)
    GPT2Model(config).to(torch.bfloat16).save_pretrained(tmp_path / "gpt2")
    model = load_eager(AutoModel, tmp_path / "gpt2")
    assert type(model) is GPT2Model and model.config._attn_implementation == "eager" and not model.training
    state = model.state_dict()
    for name, tensor in load_file(str(tmp_path / "gpt2" / "model.safetensors")).items():
        assert tensor.dtype == torch.bfloat16 and state[name].dtype == torch.float32
        assert torch.equal(state[name], tensor.float()), name
    (tmp_path / "gpt2" / "model.safetensors").unlink()
    with pytest.raises(BiasvizError, match=r"^cannot load the transformers model in .*gpt2: .*model\.safetensors"):
        load_eager(AutoModel, tmp_path / "gpt2")
