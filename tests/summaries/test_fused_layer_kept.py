"""The fused path (:mod:`biasviz.summaries.fused_layer`) for calls whose bias a summary's forward kept as a table of
j - i (:class:`~biasviz.adapters.kept_bias.KeptBias`): ALiBi written into a traced SDPA call's float mask, into eager
PyTorch or a flex_attention score_mod, and T5's decoder through its hooks; or as a row of keys: BLOOM's m·j through its
hooks, and the same written into a traced SDPA call. And calls whose softmax does more than softmax(s): Gemma 2's
cap·tanh(s / cap), GPT-OSS's sink columns. File against file with the torch path, every
dataset of the layer, as tests/summaries/test_fused_layer.py holds our own models' (the kernels' sums from float64
numpy there, so that what turns sums into the file is proven apart from the kernels)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.extraction.one_layer import positions
from tests.extraction.test_summary_added_bias import SLOPES, Alibi
from tests.summaries.test_fused_layer import _compare, _reference_accumulators
from tests.summaries.test_sample_cells import VOCAB, T

N = 3


def _t5_decoder() -> Any:
    from transformers import T5Config, T5ForConditionalGeneration

    from biasviz.adapters.transformers_models import T5Adapter

    config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      dropout_rate=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = T5ForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    return T5Adapter(model, part="decoder", scheme="t5", n_layers=2, n_heads=4, source="test")


class KeyBias(Alibi):
    """BLOOM's bias written into an SDPA float mask: slope·j, a row of keys, -inf after the query."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        return (SLOPES * j.float()).masked_fill(j > i, float("-inf"))[None]


class CellsBias(Alibi):
    """A bias of each cell in an SDPA float mask, neither a table of j - i nor a row of keys: -slope·log(1 + i - j)
    grown by (1 + i / T), as FIRE's interpolation by the query is written in research code; -inf after the query."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        bias = -SLOPES * torch.log1p((i - j).clamp(min=0).float()) * (1 + i / ids.shape[1])
        return bias.masked_fill(j > i, float("-inf"))[None]


def _hooked(name: str) -> Any:
    """transformers' BLOOM, MPT or Falcon with ALiBi (1 layer, 4 heads, random weights) through its hooks: a bias of
    the key, m·j (MPT's m·(j - T + 1); Falcon's scaled with q·k)."""
    import transformers

    from biasviz.adapters import transformers_alibi

    torch.manual_seed(0)
    if name == "bloom":
        model = transformers.BloomModel(transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4))
    elif name == "mpt":
        model = transformers.MptModel(transformers.MptConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=4,
                                                             max_seq_len=T))  # fmt: skip
    else:
        config = transformers.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=4, alibi=True, new_decoder_architecture=False,
                                           multi_query=False, parallel_attn=False, bias=True)  # fmt: skip
        model = transformers.FalconModel._from_config(config, attn_implementation="eager")  # as biasviz loads it
    adapter = {"bloom": transformers_alibi.BloomAdapter, "mpt": transformers_alibi.MptAdapter,
               "falcon": transformers_alibi.FalconAdapter}[name]  # fmt: skip
    return adapter(model.eval(), scheme="alibi", n_layers=1, n_heads=4, source="test")


def _softmax_extras(name: str) -> torch.nn.Module:
    """transformers' Gemma 2 (its scores capped at 0.5: q made large, so that the cap bends them) or GPT-OSS (a learned
    sink column per head, drawn large enough to take a share), one eager layer in a sliding window of 5 keys."""
    from tests.tracing.test_eager_kept_sinks import gpt_oss

    if name == "gpt_oss":
        return gpt_oss(1)
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, attn_logit_softcapping=0.5,
                          sliding_window=5)  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(30.0)
    return model


def _summary(model: Any, ids: np.ndarray, out: Path, mode: str,
             monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, np.ndarray], dict[str, Any]]:  # fmt: skip
    from biasviz.extraction.summary import extract_summary

    monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if isinstance(model, torch.nn.Module):
            biasviz.extract(model, ids, out, summary=True, resolution=8, device="cpu", progress=False)
        else:
            extract_summary(model, ids, out, layers=-1, resolution=8, device="cpu", progress=False)
    with h5py.File(out) as f:
        (name,) = (g for g in f if g.startswith("layer_"))
        return {key: f[name][key][()] for key in f[name]}, {**f.attrs, **f[name].attrs}


@pytest.mark.parametrize("written", ["sdpa", "eager", "flex", "t5 decoder", "keys, sdpa", "cells, sdpa", "cells, eager",
                                     "bloom", "mpt", "falcon", "gemma2", "gpt_oss"])
def test_a_kept_table_of_distance_takes_the_fused_path_and_writes_what_the_torch_path_writes(
        written: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from biasviz.summaries import kernels

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)
    ids = np.random.default_rng(4).integers(1, VOCAB, size=(N, T))

    def model() -> Any:
        if written == "t5 decoder":
            return _t5_decoder()
        if written in ("bloom", "mpt", "falcon"):
            return _hooked(written)
        if written in ("gemma2", "gpt_oss"):
            return _softmax_extras(written)
        torch.manual_seed(0)
        kind = {"keys": KeyBias, "cells": CellsBias}.get(written.split(",")[0], Alibi)
        layer = kind("alibi").eval()
        layer.written = written.split(", ")[-1]
        return layer

    torch_path, torch_attrs = _summary(model(), ids, tmp_path / "torch.h5", "torch", monkeypatch)
    fused, fused_attrs = _summary(model(), ids, tmp_path / "fused.h5", "fused", monkeypatch)
    assert (torch_attrs["statistics"], fused_attrs["statistics"]) == ("torch", "fused")
    _compare(fused, torch_path)


@pytest.mark.parametrize("bias", ["distance", "keys", "cells", "gemma2", "gpt_oss"])
def test_the_kernels_themselves_take_a_kept_table_as_a_scheme_s(bias: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The same for ALiBi in a traced SDPA call, BLOOM's m·j, Gemma 2's softcap and GPT-OSS's sinks, the sums from the
    kernels, run on the CPU by Triton's interpreter."""
    pytest.importorskip("triton")
    from biasviz.summaries import kernels

    if not kernels.interpreted() and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
    ids = np.random.default_rng(4).integers(1, VOCAB, size=(N, T))
    torch.manual_seed(0)
    kinds = {"distance": Alibi, "keys": KeyBias, "cells": CellsBias}
    layer = _softmax_extras(bias) if bias in ("gemma2", "gpt_oss") else kinds[bias]("alibi").eval()
    torch_path, _ = _summary(layer, ids, tmp_path / "torch.h5", "torch", monkeypatch)
    fused, attrs = _summary(layer, ids, tmp_path / "fused.h5", "fused", monkeypatch)
    assert attrs["statistics"] == "fused"
    _compare(fused, torch_path)
