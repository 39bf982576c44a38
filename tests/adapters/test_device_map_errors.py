"""A device map the user got wrong ends in one ``Error:`` line and writes nothing: no output file, no offload folder,
no temporary folder; an interrupted placed run leaves no partial output and no temporary offload folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli, small_model

pytest.importorskip("accelerate")

BIASVIZ = Path(sys.executable).with_name("biasviz")
TEXT = "\n".join(f"for k{i} in range({i}):\n    total += k{i} ** 2  # step {i}" for i in range(400))
GOOD_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "disk",
            "model.rotary_emb": "cpu", "lm_head": "disk"}  # fmt: skip


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("placed_errors")
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(root / "llama")
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(root / "llama_bf16")  # its config says bfloat16
    small_model("alibi", vocab_size=300).save_pretrained(root / "ours")
    (root / "text.txt").write_text(TEXT)
    (root / "a_file").write_text("not a folder\n")
    for name, layout in {"missing_gpu": {**GOOD_MAP, "model.layers.1": "cuda:99"},
                         "unknown_module": {**GOOD_MAP, "model.layers.7": "cpu"},
                         "left_out": {k: v for k, v in GOOD_MAP.items() if k != "lm_head"},
                         "no_device": {**GOOD_MAP, "model.layers.1": "tpu"}}.items():  # fmt: skip
        (root / f"{name}.json").write_text(json.dumps(layout))
    return root


def _argv(env: Path, out: Path, *extra: str, model: str = "llama", samples: int = 2) -> list[str]:
    return ["extract", "--model", str(env / model), "--text", str(env / "text.txt"), "--seq-len", "32",
            "--samples", str(samples), "--layer", "all", "--quiet", "--out", str(out), *extra]  # fmt: skip


CASES = [  # (id, options, exit code, the error line)
    ("gpu-in-map", ["--device-map", "{env}/missing_gpu.json"], 1,
     r"module 'model.layers.1' names GPU 99 .*does not exist"),
    ("no-such-device", ["--device-map", "{env}/no_device.json"], 1, r"names the device 'tpu'; use cpu, disk"),
    ("gpu-in-budget", ["--device-map", "auto", "--max-memory", "99=1GiB"], 1, r"--max-memory 99=1GiB names GPU 99"),
    ("budget-below-a-layer", ["--device-map", "auto", "--max-memory", "cpu=10KiB"], 1,
     r"gives the CPU, where the layers run, 10.0 KiB; it cannot hold one layer \(model\.layers\.\d: "),
    ("not-a-size", ["--device-map", "auto", "--max-memory", "cpu=lots"], 1, r"'lots' is not a size"),
    ("folder-is-a-file", ["--device-map", "auto", "--offload-folder", "{env}/a_file"], 1, r"a_file is a file"),
    ("folder-under-a-file", ["--device-map", "auto", "--offload-folder", "{env}/a_file/sub"], 1, r"a_file is a file"),
    ("unknown-module", ["--device-map", "{env}/unknown_module.json"], 1, r"'model\.layers\.7', which is not a module"),
    ("module-left-out", ["--device-map", "{env}/left_out.json"], 1, r"places no module holding 'lm_head\.weight'"),
    ("neither-strategy-nor-file", ["--device-map", "everywhere"], 1, r"not auto, balanced or sequential"),
    ("budget-without-map", ["--max-memory", "cpu=1GiB"], 1, r"--max-memory applies with --device-map"),
    ("budget-with-json-map", ["--device-map", "{env}/missing_gpu.json", "--max-memory", "cpu=1GiB"], 1,
     r"names GPU 99"),
    ("device-and-map", ["--device-map", "auto", "--device", "cpu"], 2,
     r"--device cpu does not apply with --device-map"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "code", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_mistake_is_one_error_line_and_nothing_is_written(env: Path, tmp_path: Path, temp_root: Path, capsys,
                                                               options: list[str], code: int,
                                                               pattern: str) -> None:  # fmt: skip
    out = tmp_path / "out.h5"
    got, stdout, err = run_cli(_argv(env, out, *(o.format(env=env) for o in options)), capsys)
    lines = err.strip().splitlines()
    assert got == code, err
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists() and not stdout
    assert not list(tmp_path.glob("*.tmp")) and not list(temp_root.iterdir())


def test_a_budget_is_weighed_in_the_precision_the_model_runs_in(env: Path, tmp_path: Path, capsys) -> None:
    """A bfloat16 checkpoint run in float32 (the default): a layer takes twice its size on disk. 64 + 2·32 key and
    value rows of 64, 3·128 MLP rows of 64 and two norms: 36,992 values, 144.5 KiB in float32, 72.3 KiB in bfloat16."""
    out = tmp_path / "out.h5"
    code, _, err = run_cli(_argv(env, out, "--device-map", "auto", "--max-memory", "cpu=100KiB", model="llama_bf16"),
                           capsys)  # fmt: skip
    assert code == 1 and len(err.strip().splitlines()) == 1 and err.startswith("Error: "), err
    assert re.search(r"100.0 KiB; it cannot hold one layer \(model\.layers\.\d: 144.5 KiB in float32\)", err), err
    assert not out.exists()


def test_a_biasviz_checkpoint_is_not_placed(env: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(_argv(env, tmp_path / "o.h5", "--device-map", "auto", model="ours"), capsys)
    assert code == 1 and err.count("Error:") == 1 and "applies to transformers model directories" in err


def test_torchrun_is_refused_before_the_processes_wait(env: Path, tmp_path: Path, capsys,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    code, _, err = run_cli(_argv(env, tmp_path / "o.h5", "--device-map", "auto"), capsys)
    assert code == 2 and err.strip().startswith("Error: --device-map runs in one process"), err
    assert not (tmp_path / "o.h5").exists()


def test_without_accelerate_the_error_names_the_extra(env: Path, tmp_path: Path, capsys,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate now fails, as when it is not installed
    code, _, err = run_cli(_argv(env, tmp_path / "o.h5", "--device-map", "auto"), capsys)
    assert code == 1 and err.strip() == "Error: --device-map needs the accelerate package, an optional extra: pip " \
                                        "install 'biasviz[big]'"  # fmt: skip


def test_an_offload_folder_that_cannot_be_written_is_refused(env: Path, tmp_path: Path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    immutable = os.geteuid() == 0 and not subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode
    try:
        if os.geteuid() == 0 and not immutable:
            pytest.skip("root writes into any folder, and chattr is not available here")
        code, _, err = run_cli(_argv(env, tmp_path / "o.h5", "--device-map", "auto", "--offload-folder",
                                     str(locked / "weights")), capsys)  # fmt: skip
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        locked.chmod(0o755)
    assert code == 1 and err.count("\n") == 1 and "cannot write in" in err and "locked" in err, err
    assert not (locked / "weights").exists() and not (tmp_path / "o.h5").exists()


def test_a_killed_runs_temporary_offload_folder_is_removed_by_the_next(temp_root: Path) -> None:
    from biasviz.adapters.device_map import OFFLOAD_PREFIX, offload_space, placement_from

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = temp_root / f"{OFFLOAD_PREFIX}{gone.pid}-x1"
    stale.mkdir()
    (stale / "w.safetensors").write_bytes(b"0")
    mine = temp_root / f"{OFFLOAD_PREFIX}{os.getpid()}-x2"  # a live process's: kept
    mine.mkdir()
    with offload_space(placement_from("auto")) as placement:
        assert placement.offload_folder.is_dir()
    assert not stale.exists() and mine.exists()


def _default_signals() -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_an_interrupted_placed_run_leaves_no_output_and_no_offload_folder(env: Path, tmp_path: Path,
                                                                          sig: int) -> None:  # fmt: skip
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    out = tmp_path / "run.h5"
    argv = [str(BIASVIZ), *_argv(env, out, "--device-map", "auto", "--max-memory", "cpu=300KB", samples=400)]
    # as from a shell: Ctrl-C and SIGTERM at their defaults, whatever this test process inherited (a test runner's
    # worker may ignore SIGINT, and a child inherits an ignored signal)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(temp_root)}, preexec_fn=_default_signals)  # fmt: skip
    end = time.monotonic() + 60
    while not list(tmp_path.glob(".*.tmp")):  # the output is being written: the model is placed and running
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.005)
    assert [p.name.startswith("biasviz-offload-") for p in temp_root.iterdir()] == [True]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    assert not list(temp_root.iterdir()), "the temporary offload folder was left behind"
