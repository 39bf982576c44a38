"""Extraction against independent math: what lands in the file is exactly each scheme's bias, and
weights equal a softmax recomputed here from q and k (transformers' GPT-2, read from its state dict, against its own
attention: tests/adapters/test_nanogpt.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.models.t5.modeling_t5 import T5Attention

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.errors import BiasvizError
from biasviz.extraction.run import extract
from biasviz.store import BiasFileWriter, open_bias_file
from tests.conftest import ALL_SCHEMES, small_model

H, C, T, N = 12, 48, 40, 3
LAST = 1  # the final layer of the 2-layer test model


def windows(n: int = N, t: int = T, vocab: int = 97, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(n, t))


def distinct_params(model: torch.nn.Module) -> torch.nn.Module:
    """Move scheme parameters away from their initial values, so the math is tested, not the init."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for block in model.blocks:
            s = block.attn.pos_bias
            name = model.config.scheme
            if name.startswith("kerple"):
                s.r1.copy_(torch.rand(H, generator=g) * 2 + 0.05)
                s.r2.copy_(torch.rand(H, generator=g) * 1.5 + 0.05)
            elif name == "fire":
                s.threshold.fill_(8.0)  # so that max(L, i) switches from L to i inside the window
                s.c.fill_(0.3)
                for p in s.mlp.parameters():
                    p.copy_(torch.randn(p.shape, generator=g))
            elif name in ("cable", "fox"):
                s.proj.weight.copy_(torch.randn(s.proj.weight.shape, generator=g) * 0.5)
                s.proj.bias.copy_(torch.randn(H, generator=g))
    return model


def layer_input(model: torch.nn.Module, ids: np.ndarray, layer: int) -> torch.Tensor:
    """The attention input x (after ln_1) of ``layer``, from a plain forward hook on ln_1: (B, T, C)."""
    seen: list[torch.Tensor] = []
    handle = model.blocks[layer].ln_1.register_forward_hook(lambda _m, _i, out: seen.append(out.detach()))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids, dtype=torch.long))
    finally:
        handle.remove()
    return seen[0].double()


def reference_bias(model: torch.nn.Module, x: torch.Tensor, layer: int) -> np.ndarray:
    """b_h(i, j) from each scheme's definition (README's scheme table), written independently: (B or 1, H, T, T)."""
    scheme = model.config.scheme
    s = model.blocks[layer].attn.pos_bias
    t = x.shape[1]
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    d = np.clip(i - j, 0, None).astype(np.float64)  # (T, T); cells above the diagonal are masked anyway
    h = np.arange(1, H + 1)[:, None, None]
    if scheme == "alibi":
        return (-(2.0 ** (-8.0 * h / H)) * d)[None]
    if scheme in ("kerple-log", "kerple-power"):
        r1 = s.r1.detach().double().clamp(min=0.01).numpy()[:, None, None]
        r2 = s.r2.detach().double().clamp(min=0.01).numpy()[:, None, None]
        if scheme == "kerple-log":
            return (-r1 * np.log(1 + r2 * d))[None]
        return (-r1 * d ** np.minimum(r2, 2.0))[None]
    if scheme == "fire":
        c, L = s.c.item(), s.threshold.item()
        psi = lambda v: np.log(c * v + 1)  # noqa: E731
        u = psi(d) / psi(np.maximum(L, i))  # (T, T)
        w1, b1 = s.mlp[0].weight.detach().double().numpy()[:, 0], s.mlp[0].bias.detach().double().numpy()
        w2, b2 = s.mlp[2].weight.detach().double().numpy(), s.mlp[2].bias.detach().double().numpy()
        hidden = np.maximum(u[..., None] * w1 + b1, 0)  # (T, T, hidden)
        return (hidden @ w2.T + b2).transpose(2, 0, 1)[None]  # (1, H, T, T)
    if scheme == "t5":
        rel = torch.as_tensor(j - i)  # memory position minus query position
        buckets = T5Attention._relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
        table = s.table.weight.detach().double().numpy()  # (buckets, H)
        return table[buckets.numpy()].transpose(2, 0, 1)[None]
    if scheme in ("cable", "fox"):  # -sum softplus(z_k), or sum log sigmoid(z_k), over k = j+1 .. i
        z = x @ s.proj.weight.detach().double().T + s.proj.bias.detach().double()  # (B, T, H)
        per_token = (-F.softplus(z) if scheme == "cable" else F.logsigmoid(z)).numpy()
        out = np.zeros((x.shape[0], H, t, t))
        for qi in range(t):
            for kj in range(qi + 1):
                out[:, :, qi, kj] = per_token[:, kj + 1 : qi + 1].sum(axis=1)
        return out
    raise AssertionError(scheme)


def reference_weights(model: torch.nn.Module, x: torch.Tensor, bias: np.ndarray | None, layer: int) -> np.ndarray:
    """softmax(q.k / sqrt(d_head) + b) over j <= i, from q, k recomputed via c_attn in float64."""
    attn = model.blocks[layer].attn
    qkv = x @ attn.c_attn.weight.detach().double().T + attn.c_attn.bias.detach().double()
    q, k, _ = qkv.split(C, dim=-1)
    B, t, _ = x.shape
    q = q.view(B, t, H, C // H).transpose(1, 2).numpy()
    k = k.view(B, t, H, C // H).transpose(1, 2).numpy()
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(C // H)
    if bias is not None:
        scores = scores + bias
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_captured_bias_and_weights_equal_independent_math(scheme, tmp_path):
    model = distinct_params(small_model(scheme))
    ids = windows()
    result = extract(BiasGPTAdapter(model, source="test"), ids, tmp_path / "x.h5", batch_size=2, seed=0)
    x = layer_input(model, ids, LAST)
    adds_bias = scheme not in ("learned", "nope")
    ref_b = reference_bias(model, x, LAST) if adds_bias else None
    ref_w = reference_weights(model, x, ref_b, LAST)
    used = np.tril(np.ones((T, T), bool))
    with open_bias_file(result.path) as f:
        assert f.layers == [LAST] and f.scheme == scheme and f.has_bias() == adds_bias
        np.testing.assert_array_equal(f.input_ids(), ids)
        w = f.read("weights")
        np.testing.assert_allclose(w, ref_w, atol=2e-6, rtol=1e-5)
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)  # every row is a distribution
        assert (w[..., ~used] == 0).all()
        if adds_bias:
            b = f.read("bias")
            assert np.isnan(b[..., ~used]).all()
            np.testing.assert_allclose(b[..., used], np.broadcast_to(ref_b, b.shape)[..., used], atol=2e-5, rtol=1e-5)
            same = (b[..., used] == b[:1][..., used]).all()
            assert same != (scheme in ("cable", "fox"))  # only CABLE's and FoX's biases depend on the input


def test_reference_math_catches_a_wrong_bias(tmp_path):
    """The comparison above can fail: ALiBi with interleaved slopes is not the geometric reference."""
    model = small_model("alibi", scheme_options={"slopes": "interleaved"})
    result = extract(BiasGPTAdapter(model, source="test"), windows(1), tmp_path / "x.h5")
    ref = reference_bias(model, layer_input(model, windows(1), LAST), LAST)
    with open_bias_file(result.path) as f:
        b = f.read("bias")[0]
    used = np.tril(np.ones((T, T), bool))
    assert not np.allclose(b[:, used], ref[0][:, used], atol=1e-3)


def test_all_layers_and_uneven_batches_stream_one_batch_at_a_time(tmp_path, monkeypatch):
    sizes: list[int] = []
    original = BiasFileWriter.write_batch

    def spy(self, input_ids, weights, bias=None, scores=None):  # noqa: ANN001, ANN202
        sizes.append(len(input_ids))
        assert all(w.shape[0] == len(input_ids) for w in weights.values())
        return original(self, input_ids, weights, bias, scores)

    monkeypatch.setattr(BiasFileWriter, "write_batch", spy)
    model = distinct_params(small_model("cable"))
    ids = windows(5)
    result = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "a.h5", layers="all", batch_size=2,
                     device="cpu")  # fmt: skip  (on a GPU the batches stream as encoded chunks: test_gpu_encode.py)
    assert sizes == [2, 2, 1]
    with open_bias_file(result.path) as f:
        assert f.layers == [0, 1] and f.n_samples == 5
        used = np.tril(np.ones((T, T), bool))
        ref = reference_bias(model, layer_input(model, ids, 0), 0)
        np.testing.assert_allclose(f.read("bias", 0)[..., used], ref[..., used], atol=2e-5)
    for name, module in model.named_modules():  # every hook is gone afterwards
        assert not module._forward_hooks and not module._forward_pre_hooks, name


def test_uncaptured_layers_stay_fused_and_the_pass_stops_early(tmp_path, monkeypatch):
    from biasviz.model import modeling

    calls = {"sdpa": 0, "eager": 0}
    sdpa, eager = F.scaled_dot_product_attention, modeling.attention_pattern

    def count_sdpa(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls["sdpa"] += 1
        return sdpa(*a, **k)

    def count_eager(*a, **k):  # noqa: ANN002, ANN003, ANN202
        calls["eager"] += 1
        return eager(*a, **k)

    monkeypatch.setattr(modeling.F, "scaled_dot_product_attention", count_sdpa)
    monkeypatch.setattr(modeling, "attention_pattern", count_eager)
    model = small_model("alibi")
    head_calls: list[int] = []
    handle = model.lm_head.register_forward_hook(lambda *_: head_calls.append(1))
    try:
        extract(BiasGPTAdapter(model, source="t"), windows(2), tmp_path / "last.h5")
        assert calls == {"sdpa": 2, "eager": 2}  # layer 0 fused, layer 1 eager, for each of 2 samples
        calls.update(sdpa=0, eager=0)
        extract(BiasGPTAdapter(model, source="t"), windows(2), tmp_path / "first.h5", layers=0)
        assert calls == {"sdpa": 0, "eager": 2}  # layer 1 never runs when layer 0 is all that is wanted
    finally:
        handle.remove()
    assert head_calls == []  # no logits are ever computed


def test_float16_storage_matches_float32(tmp_path):
    model = distinct_params(small_model("kerple-log"))
    adapter = BiasGPTAdapter(model, source="t")
    a = extract(adapter, windows(), tmp_path / "a.h5", dtype="float32")
    b = extract(adapter, windows(), tmp_path / "b.h5", dtype="float16")
    with open_bias_file(a.path) as fa, open_bias_file(b.path) as fb:
        assert fb.dataset("bias").dtype == np.float16 and fb.attrs["dtype"] == "float16"
        np.testing.assert_allclose(fb.read("weights"), fa.read("weights"), atol=1e-3)
        np.testing.assert_allclose(fb.read("bias"), fa.read("bias"), rtol=1e-3, atol=1e-3)


def test_provenance_attributes(tmp_path):
    model = small_model("fire")
    adapter = BiasGPTAdapter(model, source="/models/fire", sha256="cd" * 32)
    out = extract(adapter, windows(), tmp_path / "p.h5", seed=11, text_source="my.txt", attrs={"tokenizer": "tok"},
                  device="cpu")  # fmt: skip
    with open_bias_file(out.path) as f:
        a = f.attrs
    assert a["scheme"] == "fire" and a["context_dependent"] is False and a["architecture"] == "biasviz-gpt2"
    assert a["source_model"] == "/models/fire" and a["model_sha256"] == "cd" * 32
    assert a["n_layers"] == 2 and a["n_heads"] == H and a["seq_len"] == T and a["samples"] == N
    assert a["layers"] == [LAST] and a["seed"] == 11 and a["text_source"] == "my.txt" and a["tokenizer"] == "tok"
    assert a["device"] == "cpu" and a["bias_convention"] == "relative" and a["torch_version"] == torch.__version__
    assert '"scheme": "fire"' in a["config_json"] and a["created_utc"].endswith("+00:00")


def test_bad_inputs_are_clear_errors(tmp_path):
    adapter = BiasGPTAdapter(small_model("learned"), source="t")  # 256 learned positions
    with pytest.raises(BiasvizError, match="exceeds the 256 positions"):
        extract(adapter, windows(1, 300), tmp_path / "a.h5")
    with pytest.raises(BiasvizError, match="outside the model's vocabulary"):
        extract(adapter, windows(1, 8, vocab=500), tmp_path / "a.h5")
    with pytest.raises(BiasvizError, match="out of range"):
        extract(adapter, windows(1), tmp_path / "a.h5", layers=2)
    (tmp_path / "a.h5").write_text("keep")
    with pytest.raises(BiasvizError, match="--force"):
        extract(adapter, windows(1), tmp_path / "a.h5")
    assert (tmp_path / "a.h5").read_text() == "keep"


@pytest.mark.cuda
def test_cuda_extraction_matches_cpu(tmp_path):
    model = distinct_params(small_model("cable"))
    ids = windows(5)
    cpu = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "cpu.h5", batch_size=2, device="cpu")
    gpu = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "gpu.h5", batch_size=2, device="cuda")
    with open_bias_file(cpu.path) as a, open_bias_file(gpu.path) as b:
        assert b.attrs["device"].startswith("cuda:")
        np.testing.assert_allclose(b.read("weights"), a.read("weights"), atol=1e-5)
        np.testing.assert_allclose(b.read("bias"), a.read("bias"), atol=1e-4)
