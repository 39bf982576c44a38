"""The GPU path of extraction: chunks encoded on the device equal the writer's own, files equal the CPU's."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.common.errors import BiasvizError
from biasviz.extraction.run import extract
from biasviz.store import BiasFileWriter, open_bias_file
from tests.conftest import small_model
from tests.store.small_files import _attrs as store_attrs

T, H = 24, 12


def deflated_chunk(matrix: np.ndarray, kind: str, dtype: str, causal: bool = True) -> bytes:
    """HDF5's shuffle + deflate of one masked matrix (by the causal rule, or none), written from the format's
    definition."""
    m = np.array(matrix, dtype=np.float64)
    upper = np.triu(np.ones_like(m, dtype=bool), k=1) & causal
    m[upper] = np.nan if kind == "bias" else 0.0
    raw = m.astype(dtype).reshape(-1).view(np.uint8).reshape(-1, np.dtype(dtype).itemsize)
    return zlib.compress(np.ascontiguousarray(raw.T).tobytes(), 1)


def new_writer(path, dtype: str = "float32") -> BiasFileWriter:
    return BiasFileWriter(path, attrs=store_attrs(), n_samples=2, n_heads=H, seq_len=T, layers=[0],
                          has_bias=True, dtype=dtype)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_chunks_handed_over_encoded_read_back_as_the_matrices(tmp_path, dtype: str) -> None:
    rng = np.random.default_rng(0)
    bias = rng.normal(size=(2, H, T, T)) * 10
    weights = rng.random(size=(2, H, T, T))
    with new_writer(tmp_path / "x.h5", dtype) as w:
        assert w.direct_chunks and w.shuffled and w.deflate_level == 1
        first = w.begin_batch(np.arange(2 * T).reshape(2, T))
        for s in range(2):
            for h in range(H):
                w.write_chunk("bias", 0, first + s, h, deflated_chunk(bias[s, h], "bias", dtype))
                w.write_chunk("weights", 0, first + s, h, deflated_chunk(weights[s, h], "weights", dtype))
    with open_bias_file(tmp_path / "x.h5") as f:
        lower = np.tril(np.ones((T, T), dtype=bool))
        np.testing.assert_array_equal(f.read("bias", 0)[..., lower], bias.astype(dtype)[..., lower])
        assert np.isnan(f.read("bias", 0)[..., ~lower]).all()
        np.testing.assert_array_equal(f.read("weights", 0), np.where(lower, weights, 0).astype(dtype))
        np.testing.assert_array_equal(f.input_ids(), np.arange(2 * T).reshape(2, T))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_chunks_are_the_bytes_the_cpu_writer_stores(tmp_path, dtype: str) -> None:
    from biasviz.store.gpu_encode import GpuChunkEncoder

    g = torch.Generator().manual_seed(0)
    tensors = {("bias", 0): torch.randn(1, H, T, T, generator=g) * 30,
               ("weights", 0): torch.rand(2, H, T, T, generator=g)}  # fmt: skip
    with GpuChunkEncoder(torch.device("cuda"), seq_len=T, storage=np.dtype(dtype), causal=True, level=1,
                         shuffle=True, workers=3, pinned_budget=1) as enc:  # fmt: skip
        assert enc.n_buffers == 2  # a tiny budget still cycles through a ring of two
        chunks = list(enc.encode({k: v.cuda() for k, v in tensors.items()}))
        got = {(c.kind, c.samples, c.head): c.data.result() for c in chunks}
    assert len(got) == 3 * H
    for h in range(H):
        want = deflated_chunk(tensors["bias", 0][0, h].numpy(), "bias", dtype)
        assert zlib.decompress(got[("bias", (0, 1), h)]) == zlib.decompress(want)  # the same bytes, NaN bits too
        for s in range(2):
            want = deflated_chunk(tensors["weights", 0][s, h].numpy(), "weights", dtype)
            assert zlib.decompress(got[("weights", (s,), h)]) == zlib.decompress(want)


@pytest.mark.cuda
def test_gpu_chunks_keep_each_layer_s_own_rule() -> None:
    """A bidirectional file with a causal layer (an encoder-decoder's decoder self-attention): each layer's chunks
    masked by its own rule, as the CPU writer masks them."""
    from biasviz.store.gpu_encode import GpuChunkEncoder

    g = torch.Generator().manual_seed(0)
    tensors = {("bias", layer): torch.randn(1, H, T, T, generator=g) for layer in (0, 1)}
    with GpuChunkEncoder(torch.device("cuda"), seq_len=T, storage=np.dtype("float32"), causal=False, level=1,
                         shuffle=True, layer_causal={1: True}) as enc:  # fmt: skip
        got = {(c.layer, c.head): c.data.result() for c in enc.encode({k: v.cuda() for k, v in tensors.items()})}
    for layer, causal in ((0, False), (1, True)):
        for h in range(H):
            want = deflated_chunk(tensors["bias", layer][0, h].numpy(), "bias", "float32", causal)
            assert zlib.decompress(got[(layer, h)]) == zlib.decompress(want)


@pytest.mark.cuda
@pytest.mark.parametrize("scheme", ["alibi", "cable"])  # a bias shared by the batch, and one per sample
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_file_equals_cpu_file(tmp_path, scheme: str, dtype: str) -> None:
    model = small_model(scheme)
    ids = np.random.default_rng(1).integers(0, 97, size=(5, T))
    args = dict(layers="all", batch_size=2, dtype=dtype)
    cpu = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "c.h5", device="cpu", **args)
    gpu = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "g.h5", device="cuda", **args)
    tol = 1e-5 if dtype == "float32" else 2e-3
    with open_bias_file(cpu.path) as a, open_bias_file(gpu.path) as b:
        np.testing.assert_array_equal(b.input_ids(), a.input_ids())
        for layer in (0, 1):
            for kind in ("bias", "weights"):
                np.testing.assert_allclose(b.read(kind, layer), a.read(kind, layer), atol=tol, rtol=tol)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_nan_and_float16_overflow_are_refused_on_every_device(tmp_path, device: str) -> None:
    ids = np.random.default_rng(1).integers(0, 97, size=(2, T))
    broken = small_model("alibi")
    with torch.no_grad():
        broken.blocks[1].attn.c_attn.weight[0, 0] = float("nan")
    with pytest.raises(BiasvizError, match="NaN or infinite"):
        extract(BiasGPTAdapter(broken, source="t"), ids, tmp_path / "n.h5", device=device)
    steep = small_model("alibi", scheme_options={"slopes": [5000.0] * H})  # -5000 * 23 < -65504
    with pytest.raises(BiasvizError, match="beyond float16"):
        extract(BiasGPTAdapter(steep, source="t"), ids, tmp_path / "o.h5", device=device, dtype="float16")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("compression", ["none", "lzf", "gzip:6"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_each_compression_stores_what_gzip_stores_on_every_device(tmp_path, device: str, compression: str) -> None:
    """`none` is encoded where the matrices are (GPU or CPU) and handed over as raw chunks; lzf goes through h5py."""
    import h5py

    model = small_model("cable")
    ids = np.random.default_rng(2).integers(0, 97, size=(3, T))
    ref = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "ref.h5", device="cpu", layers="all",
                  batch_size=2)  # fmt: skip
    got = extract(BiasGPTAdapter(model, source="t"), ids, tmp_path / "got.h5", device=device, layers="all",
                  batch_size=2, compression=compression)  # fmt: skip
    tol = 0 if device == "cpu" else 1e-5
    with h5py.File(ref.path, "r") as a, h5py.File(got.path, "r") as b:
        for name in ("layer_0/bias", "layer_0/weights", "layer_1/bias", "layer_1/weights"):
            want = {"none": (None, None), "lzf": ("lzf", None), "gzip:6": ("gzip", 6)}[compression]
            assert (b[name].compression, b[name].compression_opts) == want, name
            np.testing.assert_allclose(b[name][()], a[name][()], atol=tol, rtol=tol)
