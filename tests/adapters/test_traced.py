"""A model traced call by call (:mod:`biasviz.adapters.traced`)."""

from __future__ import annotations

import torch

from tests.adapters.test_adapters import H, L, T, ids
from tests.conftest import small_model


def test_a_traced_biasviz_model_makes_one_call_per_layer_at_blocked_lengths(monkeypatch):
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.extraction.full_matrices import full_matrices
    from biasviz.model.modeling import Attention

    monkeypatch.setattr(Attention, "block_elements", 24 * 60)  # our own forward: many blocks of rows
    model = small_model("alibi")
    x = torch.as_tensor(ids(2))
    traced = TracedAdapter(model, scheme="alibi")
    traced.prepare(x.numpy())
    assert traced.n_layers == L  # call L is layer L, not one call per block
    with full_matrices(traced, [1]) as got:
        traced.forward(x)
    assert got.weights[1].shape == (2, H, T, T)
    assert all("block_elements" not in a.__dict__ for a in (b.attn for b in model.blocks))  # restored
    hooked = BiasGPTAdapter(model, source="t")
    with full_matrices(hooked, [1]) as ours:
        hooked.forward(x)
    torch.testing.assert_close(got.weights[1], ours.weights[1], rtol=0, atol=1e-6)


def test_a_model_whose_layers_make_two_calls_says_which_module_made_each(tmp_path):
    """DiffLlama's attention makes two SDPA calls a layer (one per half of the values, the same weights): the file's
    layers are its four calls, a warning says so, and the file records (and ``biasviz info`` shows) the module that
    made each. Call 2 is decoder layer 1's: its weights are the ones transformers' eager attention returns for it."""
    import h5py
    import numpy as np
    import pytest
    from transformers import DiffLlamaConfig, DiffLlamaForCausalLM

    import biasviz
    from biasviz.store.describe import summary

    torch.manual_seed(0)
    config = DiffLlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                             intermediate_size=64, vocab_size=128, head_dim=8)  # fmt: skip
    DiffLlamaForCausalLM(config).save_pretrained(tmp_path / "diff")
    tokens = np.random.default_rng(0).integers(3, 120, size=(2, 16))
    with pytest.warns(UserWarning, match=r"model\.layers\.0\.self_attn makes 2 attention calls a forward \(and 1 "
                                         r"other module\): each call is a layer of the file.*calls 0, 1"):
        biasviz.extract(tmp_path / "diff", tokens, tmp_path / "f.h5", layers="all", progress=False)
    owners = ["model.layers.0.self_attn"] * 2 + ["model.layers.1.self_attn"] * 2
    with h5py.File(tmp_path / "f.h5") as f:
        assert f.attrs["call_modules"] == '["' + '", "'.join(owners) + '"]'
        weights = [f[f"layer_{call}/weights"][...] for call in range(4)]
    eager = DiffLlamaForCausalLM.from_pretrained(tmp_path / "diff", attn_implementation="eager").eval()
    with torch.no_grad():
        want = eager(torch.from_numpy(tokens), output_attentions=True).attentions
    for call, layer in enumerate([0, 0, 1, 1]):
        np.testing.assert_allclose(weights[call], want[layer].numpy(), rtol=0, atol=1e-6)
    assert ("made by         0, 1: model.layers.0.self_attn; 2, 3: model.layers.1.self_attn (a layer is an attention "
            "call, in the order the model makes them)") in summary(tmp_path / "f.h5")


def test_a_model_that_attends_positions_of_its_own_is_refused_before_it_runs(tmp_path):
    """CPM-Ant prepends prompt positions to every input: its calls attend T + 4 positions for T tokens. A file holds
    one query and one key per token, so the extract is refused at once, saying why, where it ended in the writer's
    shape error after the forward."""
    import numpy as np
    import pytest
    from transformers import CpmAntConfig, CpmAntForCausalLM

    import biasviz
    from biasviz.common.errors import BiasvizError

    torch.manual_seed(0)
    config = CpmAntConfig(vocab_size=512, hidden_size=32, num_attention_heads=4, dim_head=8, dim_ff=64,
                          num_hidden_layers=2, prompt_length=4)  # fmt: skip
    CpmAntForCausalLM(config).save_pretrained(tmp_path / "cpm")
    tokens = np.random.default_rng(0).integers(3, 250, size=(2, 16))
    with pytest.raises(BiasvizError, match="attention call 1 attends 20 positions for an input of 16 tokens: the model "
                                           r"adds positions of its own \(prompt or memory tokens"):
        biasviz.extract(tmp_path / "cpm", tokens, tmp_path / "f.h5", progress=False)
    assert not (tmp_path / "f.h5").exists()


def test_a_model_that_attends_in_blocks_of_its_own_is_refused_saying_so(tmp_path):
    """LongT5's local attention runs over blocks (queries of a block against its own and the two beside it), not the
    (query, key) matrix of the input's tokens: refused before any sample runs, naming the blocks, where the message
    spoke of cross or cached attention."""
    import numpy as np
    import pytest
    from transformers import LongT5Config, LongT5ForConditionalGeneration

    import biasviz
    from biasviz.common.errors import BiasvizError

    torch.manual_seed(0)
    config = LongT5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                          local_radius=4, encoder_attention_type="local", decoder_start_token_id=0)  # fmt: skip
    LongT5ForConditionalGeneration(config).save_pretrained(tmp_path / "longt5")
    tokens = np.random.default_rng(0).integers(3, 60, size=(2, 12))
    said = r"attention call 0 attends 5 queries to 15 keys \(for an input of 12 tokens: attention in blocks of its own"
    with pytest.raises(BiasvizError, match=said):
        biasviz.extract(tmp_path / "longt5", tokens, tmp_path / "f.h5", layers=[0], progress=False)
    assert not (tmp_path / "f.h5").exists()


def test_every_call_of_a_model_with_global_tokens_is_refused_for_its_shape_first(tmp_path):
    """PEGASUS-X's encoder attends from global tokens and in local blocks, calls of other shapes and head counts:
    ``--layer all`` is refused naming a call's shape (what no choice of calls with the same head count mends), where it
    named the head counts and the next try, one call, the shape."""
    import numpy as np
    import pytest
    from transformers import PegasusXConfig, PegasusXForConditionalGeneration

    import biasviz
    from biasviz.common.errors import BiasvizError

    torch.manual_seed(0)
    config = PegasusXConfig(vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, block_size=8,
                            num_global_tokens=4, max_position_embeddings=64)  # fmt: skip
    PegasusXForConditionalGeneration(config).save_pretrained(tmp_path / "px")
    tokens = np.random.default_rng(0).integers(3, 60, size=(2, 12))
    with pytest.raises(BiasvizError, match=r"attention call 0 attends 4 queries to \d+ keys \(for an input of 12 "
                                           "tokens: attention in blocks of its own"):  # fmt: skip
        biasviz.extract(tmp_path / "px", tokens, tmp_path / "f.h5", layers="all", progress=False)
    biasviz.extract(tmp_path / "px", tokens, tmp_path / "f.h5", layers=[-1], progress=False)  # its cross attention
