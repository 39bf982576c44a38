"""Whether checkpoints belong to one series (:mod:`biasviz.training.compatible`), from their config.json and the shapes
in their safetensors headers alone: what says how a checkpoint was saved (paths, versions, precision) may differ,
anything else names the first odd checkpoint and the first key that differs. Hand-written folders; through the CLI
and real models: test_hostile_sweeps.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from biasviz.common.errors import BiasvizError
from biasviz.training.compatible import VOLATILE_KEYS, check_belong_together

CONFIG = {"model_type": "bloom", "n_head": 4, "hidden_size": 32, "vocab_size": 300}
SHAPES = {"embed.weight": (300, 32), "h.0.attn.weight": (96, 32)}


def _checkpoint(root: Path, name: str, config: object = CONFIG, shapes: dict | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[str, Path]:  # fmt: skip
    folder = root / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    tensors = {k: torch.zeros(s, dtype=dtype) for k, s in (SHAPES if shapes is None else shapes).items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return name, folder


def test_checkpoints_of_one_run_belong_together(tmp_path: Path) -> None:
    saved_differently = {**CONFIG, "_name_or_path": "/elsewhere", "transformers_version": "9.9", "dtype": "bfloat16",
                         "torch_dtype": "bfloat16", "_commit_hash": "abc", "architectures": ["Other"],
                         "use_cache": False}  # fmt: skip
    assert set(saved_differently) - set(CONFIG) == VOLATILE_KEYS
    check_belong_together([_checkpoint(tmp_path, "step0"), _checkpoint(tmp_path, "step1", saved_differently),
                           _checkpoint(tmp_path, "step2", dtype=torch.bfloat16)])  # fmt: skip


def test_one_checkpoint_or_none_is_not_compared(tmp_path: Path) -> None:
    check_belong_together([])
    check_belong_together([("step0", tmp_path / "absent")])


def test_the_first_odd_checkpoint_and_its_first_difference_are_named(tmp_path: Path) -> None:
    series = [_checkpoint(tmp_path, "step0"), _checkpoint(tmp_path, "step1"),
              _checkpoint(tmp_path, "step2", {**CONFIG, "vocab_size": 301, "n_head": 8}),
              _checkpoint(tmp_path, "step3", {**CONFIG, "hidden_size": 64})]  # fmt: skip
    with pytest.raises(BiasvizError) as raised:
        check_belong_together(series)
    assert str(raised.value) == ("checkpoint step2 does not belong with step0: config n_head: 4 against 8; a sweep "
                                 "takes the checkpoints of one training run")  # fmt: skip


def test_a_key_only_one_checkpoint_has_is_absent_from_the_other(tmp_path: Path) -> None:
    series = [_checkpoint(tmp_path, "a", {**CONFIG, "alibi": True}), _checkpoint(tmp_path, "b")]
    with pytest.raises(BiasvizError, match="checkpoint b does not belong with a: config alibi: True against absent"):
        check_belong_together(series)


def test_long_values_are_cut_to_sixty_characters(tmp_path: Path) -> None:
    long_a, long_b = "a" * 59 + "XYZ", "b" * 70
    series = [
        _checkpoint(tmp_path, "a", {**CONFIG, "note": long_a}),
        _checkpoint(tmp_path, "b", {**CONFIG, "note": long_b}),
    ]
    with pytest.raises(BiasvizError) as raised:
        check_belong_together(series)
    assert f"config note: {long_a[:60]} against {long_b[:60]};" in str(raised.value)
    assert "XY" not in str(raised.value)


@pytest.mark.parametrize(("shapes", "message"), [
    ({**SHAPES, "h.0.attn.weight": (96, 33)}, r"tensor h\.0\.attn\.weight: \(96, 32\) against \(96, 33\)"),
    ({"embed.weight": (300, 32)}, r"tensor h\.0\.attn\.weight: \(96, 32\) against absent"),
    ({**SHAPES, "lm_head.weight": (300, 32)}, r"tensor lm_head\.weight: absent against \(300, 32\)"),
])  # fmt: skip
def test_a_tensor_of_another_shape_or_missing_is_named(tmp_path: Path, shapes: dict, message: str) -> None:
    series = [_checkpoint(tmp_path, "a"), _checkpoint(tmp_path, "b", shapes=shapes)]
    with pytest.raises(BiasvizError, match=f"checkpoint b does not belong with a: {message}"):
        check_belong_together(series)


def test_the_shapes_of_every_shard_are_compared(tmp_path: Path) -> None:
    whole = _checkpoint(tmp_path, "whole")
    _, sharded = _checkpoint(tmp_path, "sharded", shapes={"embed.weight": (300, 32)})
    save_file({"h.0.attn.weight": torch.zeros(96, 32)}, str(sharded / "model-00002-of-00002.safetensors"))
    check_belong_together([whole, ("sharded", sharded)])
    (sharded / "model-00002-of-00002.safetensors").unlink()
    save_file({"h.0.attn.weight": torch.zeros(96, 31)}, str(sharded / "model-00002-of-00002.safetensors"))
    with pytest.raises(BiasvizError, match=r"tensor h\.0\.attn\.weight: \(96, 32\) against \(96, 31\)"):
        check_belong_together([whole, ("sharded", sharded)])


def test_no_config_or_one_that_is_not_an_object_holds_nothing_to_compare(tmp_path: Path) -> None:
    check_belong_together([_checkpoint(tmp_path, "a", None), _checkpoint(tmp_path, "b", ["not", "an", "object"])])
    with pytest.raises(BiasvizError, match="config hidden_size: absent against 32"):  # the first key, sorted
        check_belong_together([_checkpoint(tmp_path, "c", None), _checkpoint(tmp_path, "d")])


def test_damaged_files_are_named(tmp_path: Path) -> None:
    good = _checkpoint(tmp_path, "good")
    _, bad = _checkpoint(tmp_path, "bad")
    (bad / "config.json").write_text("{not json")
    with pytest.raises(BiasvizError, match=r"bad/config\.json cannot be read as JSON .*the checkpoint is damaged"):
        check_belong_together([good, ("bad", bad)])
    _, torn = _checkpoint(tmp_path, "torn")
    (torn / "model.safetensors").write_bytes((torn / "model.safetensors").read_bytes()[:20])
    with pytest.raises(BiasvizError, match=r"torn/model\.safetensors is not a readable safetensors file"):
        check_belong_together([good, ("torn", torn)])
