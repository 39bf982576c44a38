"""Models larger than memory: a transformers directory spread by a device map (accelerate) extracts exactly what it
extracts in memory, and the file says where each module ran.

Tiny random Llama- and BLOOM-shaped models are saved with ``save_pretrained``; a CPU budget (``max_memory``) keeps the
embedding and the first layers in memory and sends the rest to the disk, where accelerate's hooks read each module's
weights only while it runs. Every dataset of the placed run must equal the in-memory run's cell for cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.adapters.device_map import OFFLOAD_PREFIX
from biasviz.common.errors import BiasvizError
from tests.conftest import run_cli

pytest.importorskip("accelerate")

VOCAB, T, SAMPLES = 256, 24, 3
BUDGET = {"cpu": 600_000}  # bytes: the embedding and one or two layers in memory, the others on the disk
TEXT = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * i}  # line {i}" for i in range(200))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One saved random model per shape: Llama (RoPE, SDPA, traced) and BLOOM (ALiBi, its own adapter)."""
    import torch
    from transformers import BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("placed")
    llama = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    LlamaForCausalLM(llama).save_pretrained(root / "llama", max_shard_size="200KB")  # several files, as large models
    BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=4, n_head=4)).save_pretrained(root / "bloom")
    (root / "text.txt").write_text(TEXT)
    return {"llama": root / "llama", "bloom": root / "bloom", "text": root / "text.txt"}


def _ids() -> np.ndarray:
    return np.random.default_rng(1).integers(0, VOCAB, size=(SAMPLES, T))


def _datasets(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.setdefault(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def _assert_same_cells(placed: Path, memory: Path) -> None:
    a, b = _datasets(placed), _datasets(memory)
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        fields = x.dtype.names or (None,)
        for field in fields:
            u, v = (x, y) if field is None else (x[field], y[field])
            assert np.array_equal(u, v, equal_nan=True), f"{name}{'.' + field if field else ''} differs"


def _devices_of_layers(device_map: dict[str, object]) -> set[object]:
    return {d for m, d in device_map.items() if m.split(".")[-1].isdigit()}


@pytest.mark.parametrize("shape", ["llama", "bloom"])
@pytest.mark.parametrize("summary", [False, True], ids=["full", "summary"])
def test_layers_in_memory_and_on_disk_give_the_in_memory_cells(models, shape: str, summary: bool, tmp_path: Path,
                                                               temp_root: Path) -> None:  # fmt: skip
    placed, memory = tmp_path / "placed.h5", tmp_path / "memory.h5"
    common = {"layers": "all", "summary": summary, "progress": False}
    biasviz.extract(models[shape], _ids(), placed, device_map="auto", max_memory=BUDGET, **common)
    biasviz.extract(models[shape], _ids(), memory, **common)
    _assert_same_cells(placed, memory)
    with h5py.File(placed, "r") as f:
        device_map = json.loads(f.attrs["device_map"])
        assert _devices_of_layers(device_map) == {"cpu", "disk"}, device_map  # some layers in memory, some on disk
        assert json.loads(f.attrs["max_memory"]) == {"cpu": BUDGET["cpu"]}
        peak = json.loads(f.attrs["peak_memory"])
        assert peak["cpu"] > 0 and set(peak) <= {"cpu"} | {f"cuda:{i}" for i in range(16)}
        assert f.attrs["device"] == "cpu"
    with h5py.File(memory, "r") as f:
        assert "device_map" not in f.attrs and "peak_memory" not in f.attrs
    assert not list(temp_root.iterdir()), "the temporary offload folder was left behind"


def test_a_json_map_from_the_command_line_keeps_the_users_offload_folder(models, tmp_path: Path, capsys,
                                                                        temp_root: Path) -> None:  # fmt: skip
    """--device-map FILE.json places modules by name; --offload-folder is the user's and stays."""
    layout = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
              "model.layers.3": "disk", "model.norm": "disk", "model.rotary_emb": "cpu", "lm_head": "disk"}  # fmt: skip
    (tmp_path / "map.json").write_text(json.dumps(layout))
    folder = tmp_path / "offload" / "weights"  # made when the model is loaded
    base = ["extract", "--model", str(models["llama"]), "--text", str(models["text"]), "--seq-len", str(T),
            "--samples", "2", "--layer", "1,3", "--quiet"]  # fmt: skip
    code, out, err = run_cli([*base, "--device-map", str(tmp_path / "map.json"), "--offload-folder", str(folder),
                              "--out", str(tmp_path / "placed.h5")], capsys)  # fmt: skip
    assert code == 0, err
    assert run_cli([*base, "--out", str(tmp_path / "memory.h5")], capsys)[0] == 0
    _assert_same_cells(tmp_path / "placed.h5", tmp_path / "memory.h5")
    with h5py.File(tmp_path / "placed.h5", "r") as f:
        assert json.loads(f.attrs["device_map"]) == layout
        assert "max_memory" not in f.attrs
    assert folder.is_dir()
    assert not list(temp_root.iterdir())
    code, shown, _ = run_cli(["info", str(tmp_path / "placed.h5")], capsys)
    assert code == 0 and "device_map" in shown and "peak_memory" in shown


LAYOUTS = {  # layers 0 in memory, 1 to 3 on the disk
    "llama": {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "disk",
              "model.layers.3": "disk", "model.norm": "disk", "model.rotary_emb": "cpu", "lm_head": "disk"},
    "bloom": {"word_embeddings": "cpu", "word_embeddings_layernorm": "cpu", "h.0": "cpu", "h.1": "disk", "h.2": "disk",
              "h.3": "disk", "ln_f": "disk"},
}  # fmt: skip


def _in_memory(model: Path, tmp_path: Path, **options: object) -> Path:
    out = tmp_path / "memory.h5"
    biasviz.extract(model, _ids(), out, progress=False, **options)
    return out


def test_a_placed_model_is_not_moved_and_runs_in_its_loaded_precision(models, tmp_path: Path) -> None:
    """model_dtype= chooses the precision it is loaded in; extraction converts nothing."""
    out = tmp_path / "bf16.h5"
    biasviz.extract(models["llama"], _ids(), out, device_map="auto", max_memory=BUDGET, model_dtype="bfloat16",
                    progress=False)  # fmt: skip
    with h5py.File(out, "r") as f:
        assert f.attrs["model_dtype"] == "bfloat16"
        weights = f["layer_3/weights"][()]
    assert np.isfinite(weights).all() and np.allclose(weights.sum(-1), 1.0, atol=1e-2)


def test_a_model_loaded_with_a_device_map_by_the_user_runs_where_it_is(models, tmp_path: Path) -> None:
    """A model the user spread (every weight in memory, no offload) is traced without being moved."""
    import torch
    from transformers import AutoModelForCausalLM

    from biasviz.common.devices import input_device, placed

    model = AutoModelForCausalLM.from_pretrained(models["llama"], device_map={"model": "cpu", "lm_head": "cpu"},
                                                 dtype=torch.float32, local_files_only=True)  # fmt: skip
    model.hf_device_map = {"model": "cpu", "lm_head": "cpu"}
    before = [p.data_ptr() for p in model.parameters()]
    with placed(model, torch.device("cpu"), torch.float32):
        assert [p.data_ptr() for p in model.parameters()] == before
    cpu = torch.device("cpu")
    with pytest.raises(BiasvizError, match="runs in that precision"), placed(model, cpu, torch.bfloat16):
        pass
    assert input_device(model) == torch.device("cpu")
    out = tmp_path / "mine.h5"
    biasviz.extract(model, _ids(), out, forward=lambda ids: model(input_ids=ids), progress=False, layers="all")
    _assert_same_cells(out, _in_memory(models["llama"], tmp_path, layers="all"))


def test_placement_text_is_stable_across_temporary_folders() -> None:
    """A sweep's plan records the placement; a temporary offload folder must not make --resume see a change."""
    from biasviz.adapters.device_map import offload_space, placement_from

    pl = placement_from("auto", "cpu=2GiB")
    with offload_space(pl) as a, offload_space(pl) as b:
        assert a.offload_folder != b.offload_folder and str(a) == str(b)
        assert a.offload_folder.name.startswith(OFFLOAD_PREFIX)
    assert not a.offload_folder.exists() and not b.offload_folder.exists()


def test_a_sweep_of_hub_revisions_is_placed_checkpoint_by_checkpoint(models, tmp_path: Path, capsys,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     temp_root: Path) -> None:  # fmt: skip
    """--model ORG/NAME --checkpoints all from the local hub cache: every revision loads with the map."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.series_models import save_revision

    cache = tmp_path / "hub"
    config = LlamaConfig.from_pretrained(models["llama"])
    for step in (100, 200):
        torch.manual_seed(step)
        save_revision(cache, "org/llama-tiny", f"step{step}", LlamaForCausalLM(config).eval())
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    base = ["extract", "--model", "org/llama-tiny", "--checkpoints", "all", "--summary", "--text", str(models["text"]),
            "--seq-len", str(T), "--samples", "2", "--quiet"]  # fmt: skip
    code, out, err = run_cli([*base, "--device-map", "auto", "--max-memory", f"cpu={BUDGET['cpu']}",
                              "--out", str(tmp_path / "placed.h5")], capsys)  # fmt: skip
    assert code == 0, err
    assert "2 checkpoints" in out
    assert run_cli([*base, "--out", str(tmp_path / "memory.h5")], capsys)[0] == 0
    _assert_same_cells(tmp_path / "placed.h5", tmp_path / "memory.h5")
    assert not list(temp_root.iterdir())
