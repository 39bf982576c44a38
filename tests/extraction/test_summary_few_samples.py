"""Fewer than three samples (docs/position-measures.md): no ``_se`` dataset, and the file says why (a root attribute
that ``biasviz info`` shows)."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest
import torch

import biasviz


@pytest.mark.parametrize("samples", [1, 2])
def test_fewer_than_three_samples_store_no_standard_error_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], samples: int
) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import run_cli

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=64, max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 64, (samples, 16), generator=torch.Generator().manual_seed(1))
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, summary=True, progress=False)
    with h5py.File(out, "r") as f:
        assert "weights_profile" in f["layer_0"] and not [k for k in f["layer_0"] if k.endswith("_se")]
        said = f.attrs["standard_errors"]
    assert "3 samples or more" in said and f"holds {samples} sample" in said
    code, text, err = run_cli(["info", str(out)], capsys)
    assert code == 0, err
    assert "standard_errors" in text and "3 samples or more" in text
