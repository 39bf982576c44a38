"""Loading models: biasviz checkpoints, the dispatcher, and refusing pickles that would run code (nanoGPT-style
state dicts: test_nanogpt.py). The sizes, ids and assembled stream blocks below are shared with the other files of
tests/adapters/."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

import biasviz.adapters as adapters
from biasviz.adapters import ModelAdapter, load_model
from biasviz.common.errors import BiasvizError
from tests.conftest import small_model

C, H, T, V, L = 48, 12, 32, 97, 2


def ids(n: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, V, size=(n, T))


# --- pickles that would run code --------------------------------------------------------------------------------
class _Evil:
    """Unpickling this would run a shell command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "plain pickle"])
def test_malicious_pickle_is_refused_without_running(tmp_path, how):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {"model": _Evil(str(marker)), "transformer.wte.weight": torch.zeros(2, 2)}
    if how == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(BiasvizError, match="refusing to load .*run code"):
        load_model(path)
    assert not marker.exists()


# --- biasviz checkpoints and the dispatcher ---------------------------------------------------------
def test_biasviz_directory_loads_and_checks(tmp_path):
    model = small_model("t5")
    model.save_pretrained(tmp_path / "ck")
    adapter = load_model(tmp_path / "ck")
    assert adapter.scheme == "t5" and adapter.architecture == "biasviz-gpt2" and adapter.tokenizer is None
    assert adapter.sha256 and adapter.vocab_size == 97
    for a, b in zip(adapter.model.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert load_model(tmp_path / "ck" / "model.safetensors").scheme == "t5"
    assert load_model(tmp_path / "ck", "t5-bias").scheme == "t5"
    with pytest.raises(BiasvizError, match="config.json records it"):  # its config.json records the scale
        load_model(tmp_path / "ck", attn_scale=1.0)
    with pytest.raises(BiasvizError, match="trained with scheme 't5', not 'alibi'"):
        load_model(tmp_path / "ck", "alibi")


def test_biasviz_directory_with_wrong_weights_is_refused(tmp_path):
    small_model("fire").save_pretrained(tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    (tmp_path / "ck" / "config.json").write_text(json.dumps({**config, "scheme": "kerple-log"}))
    with pytest.raises(BiasvizError, match="do not match its config.json"):
        load_model(tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").unlink()
    with pytest.raises(BiasvizError, match="no model.safetensors"):
        load_model(tmp_path / "ck")


def test_dispatcher_routes_other_architectures(tmp_path, monkeypatch):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    seen = []

    class FakeBloom(ModelAdapter):  # an adapter found by asking it, as the real ones are
        model_types = ("bloom",)

        @classmethod
        def can_open(cls, path):  # noqa: ANN001, ANN206
            return (path / "config.json").is_file() and "bloom" in (path / "config.json").read_text()

        @classmethod
        def open(cls, path, scheme=None, **options):  # noqa: ANN001, ANN003, ANN206
            return seen.append((path, scheme)) or "ok"

    native = adapters.adapter_classes()[:2]
    monkeypatch.setattr(adapters, "adapter_classes", lambda: [*native, FakeBloom])
    with pytest.raises(BiasvizError, match="'bert' model.*supported: biasviz_gpt2, bloom"):
        load_model(tmp_path / "bert")
    (tmp_path / "bloom").mkdir()
    (tmp_path / "bloom" / "config.json").write_text(json.dumps({"model_type": "bloom"}))
    assert load_model(tmp_path / "bloom", "alibi") == "ok" and seen == [(tmp_path / "bloom", "alibi")]
    with pytest.raises(BiasvizError, match="--no-scale applies"):
        load_model(tmp_path / "bloom", attn_scale=1.0)


def test_dispatcher_errors(tmp_path):
    with pytest.raises(BiasvizError, match="does not exist"):
        load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BiasvizError, match="no config.json"):
        load_model(tmp_path / "empty")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(BiasvizError, match="cannot tell what"):
        load_model(tmp_path / "notes.txt")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text("{}")
    with pytest.raises(BiasvizError, match="no model_type"):
        load_model(tmp_path / "odd")


def test_malicious_pytorch_model_bin_in_a_checkpoint_directory_is_refused(tmp_path):
    small_model("alibi").save_pretrained(tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    torch.save({"embed.weight": _Evil(str(marker))}, tmp_path / "ck" / "pytorch_model.bin")
    with pytest.raises(BiasvizError, match="refusing to load .*pytorch_model.bin"):
        load_model(tmp_path / "ck")
    assert not marker.exists()


def test_each_adapter_says_which_paths_it_opens(tmp_path):
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.adapters.nanogpt import NanoGPTAdapter
    from biasviz.adapters.transformers_models import BloomAdapter, T5Adapter

    small_model("alibi").save_pretrained(tmp_path / "ours")
    torch.save(small_model("alibi").state_dict(), tmp_path / "sd.pt")
    (tmp_path / "out").mkdir()
    torch.save({"model": {}}, tmp_path / "out" / "ckpt.pt")
    (tmp_path / "bloom").mkdir()
    (tmp_path / "bloom" / "config.json").write_text(json.dumps({"model_type": "bloom"}))
    paths = {name: tmp_path / name for name in ("ours", "sd.pt", "out", "bloom")}
    opens = {cls.__name__: sorted(n for n, p in paths.items() if cls.can_open(p))
             for cls in (BiasGPTAdapter, NanoGPTAdapter, BloomAdapter, T5Adapter)}  # fmt: skip
    assert opens == {"BiasGPTAdapter": ["ours"], "NanoGPTAdapter": ["out", "sd.pt"], "BloomAdapter": ["bloom"],
                     "T5Adapter": []}  # fmt: skip
    assert [c.__name__ for c in adapters.adapter_classes()[:2]] == ["BiasGPTAdapter", "NanoGPTAdapter"]
    assert {"bloom", "mpt", "falcon", "t5", "mt5", "gpt2"} == set(adapters.hf_architectures())


# --- streaming blocks of query rows ---------------------------------------------------------------------------
def _assemble(blocks: list[tuple[int, str, int, torch.Tensor]], t: int) -> dict[tuple[int, str], torch.Tensor]:
    """Full matrices from (layer, kind, row0, block) as sent, NaN (bias) or 0 (weights) where no block reached."""
    out: dict[tuple[int, str], torch.Tensor] = {}
    for layer, kind, row0, block in blocks:
        rows, keys = block.shape[-2:]
        assert keys == row0 + rows  # causal: a query block sees no later key
        if (layer, kind) not in out:
            assert row0 == 0
            out[layer, kind] = torch.full((*block.shape[:2], t, t), float("nan") if kind == "bias" else 0.0)
        out[layer, kind][:, :, row0 : row0 + rows, :keys] = block
    return out


def _kinds(block) -> list[tuple[int, str, int, torch.Tensor]]:
    """A streamed RowBlock as (layer, kind, row0, tensor) for each quantity it holds, its attended cells (or the
    scores or bias marking them) first."""
    held = [] if block.attended is None else [(block.layer, "attended", block.r0, block.attended)]
    held += [] if block.marked is None else [(block.layer, "marked", block.r0, block.marked)]
    return held + [(block.layer, kind, block.r0, t) for kind in ("bias", "weights", "scores")
                   if (t := block.of(kind)) is not None]  # fmt: skip


