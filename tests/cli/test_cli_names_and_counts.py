"""Output names and counting: traced model directories named by their architecture (two in one folder keep apart),
one name for the bias profile whichever command draws it, plot's scheme read from its input, and diagnose's JSON
counting heads from 0 (docs/cli.md, 'How things are counted')."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.conftest import run_cli, small_model


def _tiny(kind: str, root: Path) -> Path:
    """A one-layer transformers model of architecture ``kind`` saved in ``root / 'model'`` (no biasviz adapter)."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config, cls = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM)}[kind]
    model = cls(config(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
                       intermediate_size=32, vocab_size=50, max_position_embeddings=32))  # fmt: skip
    model.save_pretrained(root / "model")
    return root / "model"


def test_two_traced_models_in_one_folder_keep_their_own_figures(tmp_path: Path, capsys) -> None:
    ids = np.random.default_rng(0).integers(0, 50, size=(1, 8))
    for kind in ("llama", "mistral"):
        out = tmp_path / f"{kind}.h5"
        biasviz.extract(str(_tiny(kind, tmp_path / kind)), ids, out, device="cpu", progress=False)
        with h5py.File(out) as f:
            assert f.attrs["scheme"] == kind
        rc, _, err = run_cli(["plot", "--input", str(out), "--kind", "weights", "--format", "png", "--out-dir",
                                 str(tmp_path / "figures")], capsys)  # fmt: skip
        assert rc == 0, err
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["llama_weights.png", "mistral_weights.png"]


@pytest.fixture
def alibi_file(tmp_path: Path) -> Path:
    out = tmp_path / "renamed.h5"
    biasviz.extract(small_model("alibi", n_head=4), np.random.default_rng(1).integers(0, 97, size=(2, 12)), out,
                    device="cpu", progress=False)  # fmt: skip
    return out


def test_plot_reads_the_scheme_from_its_input(alibi_file: Path, tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "figs"
    rc, _, err = run_cli(["plot", "--input", str(alibi_file), "--format", "png", "--out-dir", str(out_dir)], capsys)
    assert rc == 0, err
    assert [p.name for p in out_dir.iterdir()] == ["alibi_bias.png"]


def test_a_scheme_that_disagrees_with_the_file_is_one_error_line(alibi_file: Path, tmp_path: Path, capsys) -> None:
    rc, out, err = run_cli(["plot", "--scheme", "t5", "--input", str(alibi_file), "--out-dir", str(tmp_path)],
                           capsys)  # fmt: skip
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "'alibi', not 't5'" in lines[0]


def test_plot_without_scheme_or_input_is_a_usage_error(tmp_path: Path, capsys) -> None:
    rc, _, err = run_cli(["plot", "--out-dir", str(tmp_path)], capsys)
    assert rc == 2 and "give --scheme, --input or both" in err


def test_plot_and_diagnose_name_the_bias_profile_alike(alibi_file: Path, tmp_path: Path, capsys) -> None:
    plotted, diagnosed = tmp_path / "plot", tmp_path / "diagnose"
    rc, _, err = run_cli(["plot", "--input", str(alibi_file), "--kind", "profile", "--format", "png", "--out-dir",
                          str(plotted)], capsys)  # fmt: skip
    assert rc == 0, err
    rc, _, err = run_cli(["diagnose", str(alibi_file), "--format", "png", "--out-dir", str(diagnosed), "--json",
                          str(diagnosed / "d.json")], capsys)  # fmt: skip
    assert rc == 0, err
    assert "alibi_bias_profile.png" in {p.name for p in plotted.iterdir()}
    assert "alibi_bias_profile.png" in {p.name for p in diagnosed.iterdir()}
    heads = json.loads((diagnosed / "d.json").read_text())["schemes"]["alibi"]["heads"]
    assert [h["index"] for h in heads] == [0, 1, 2, 3]  # counted from 0, as every index in files and JSON
    assert [h["head"] for h in heads] == [1, 2, 3, 4]  # the old spelling, kept for scripts that read it
