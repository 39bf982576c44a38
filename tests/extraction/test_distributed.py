"""Beyond one process: torchrun extraction and training (2 CPU processes, gloo), and checkpoint sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.adapters import load_model
from biasviz.common.errors import BiasvizError, UsageError
from biasviz.extraction.run import extract
from biasviz.extraction.sweep import choose, extract_sweep
from biasviz.store.combine import combine
from biasviz.training.checkpoints import list_checkpoints
from tests.conftest import run_cli, small_model

TEXT = "def f(x):\n    return x * 2  # doubled\n" * 400


CHECKOUT = Path(__file__).resolve().parents[2]  # on PYTHONPATH, for code the processes import from tests/
ON_PROC = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the threads of the process from /proc")


def torchrun(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc-per-node=2 -m biasviz ARGS`` (gloo on the CPU)."""
    return _torchrun(["-m", "biasviz", *args], cwd, env)


def torchrun_script(code: str, name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` written to ``cwd/name`` and run by two processes, as a user's script under torchrun."""
    (cwd / name).write_text(code)
    return _torchrun([name], cwd, {"PYTHONPATH": str(CHECKOUT)})


def _torchrun(target: list[str], cwd: Path, env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *target]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def datasets(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path) as f:
        out = {"input_ids": f["input_ids"][()]}
        for group in (k for k in f if k.startswith("layer_")):
            for kind in f[group]:
                out[f"{group}/{kind}"] = f[group][kind][()]
    return out


def assert_same_datasets(one: dict[str, np.ndarray], two: dict[str, np.ndarray],
                         field_tol: tuple[float, float]) -> None:
    """Two files' datasets, name by name: the same names; values within 1e-6 relative (1e-7 absolute), the fields
    of compound datasets within ``field_tol`` (relative, absolute)."""
    assert one.keys() == two.keys()
    for name in one:
        if one[name].dtype.names:
            for field in one[name].dtype.names:
                np.testing.assert_allclose(two[name][field], one[name][field], rtol=field_tol[0], atol=field_tol[1],
                                           err_msg=name)  # fmt: skip
        else:
            np.testing.assert_allclose(two[name], one[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved 2-layer ALiBi model whose vocabulary holds every byte (so text is read as UTF-8 bytes)."""
    root = tmp_path_factory.mktemp("ddp")
    small_model("alibi", vocab_size=300).save_pretrained(root / "model")
    (root / "text.txt").write_text(TEXT)
    return root


def test_torchrun_file_equals_the_one_process_file(model_dir: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    common = ["extract", "--model", "model", "--samples", "5", "--seq-len", "40", "--layer", "all", "--text",
              "text.txt", "--quiet", "--device", "cpu"]  # fmt: skip
    run = torchrun([*common, "--out", "two.h5"], model_dir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("wrote") == 1 and "2 processes" in run.stdout  # process 0 alone reports
    monkeypatch.chdir(model_dir)
    rc, _, err = run_cli([*common, "--out", "one.h5"], capsys)
    assert rc == 0, err
    one, two = datasets(model_dir / "one.h5"), datasets(model_dir / "two.h5")
    assert one.keys() == two.keys() and len(one) == 5  # ids, and bias and weights of 2 layers
    for name in one:
        assert np.array_equal(one[name], two[name], equal_nan=True), name
    with h5py.File(model_dir / "two.h5") as f:
        assert f.attrs["processes"] == 2 and f.attrs["samples"] == 5
    assert sorted(p.name for p in model_dir.iterdir() if p.name.startswith(".")) == []  # no shard left behind


GROUP_THEN_TRAIN = """
import os, sys, weakref
import torch.distributed as dist
from biasviz.common.processes import all_true, process_group
from biasviz.training.loop import TrainSettings, train

def threads():
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]

with process_group("cpu"):
    import torch.distributed.nn  # as transformers imports it with a model, after the processes joined

    group = weakref.ref(dist.group.WORLD)
    all_true(True)
print("group alive" if group() is not None else "group freed", threads(), flush=True)

# the same processes join again, to train from Python
result = train(TrainSettings("alibi", steps=2, seq_len=16, batch_size=2, corpus="text.txt", device="cpu"), "api",
               progress=False)
state = "joined" if dist.is_initialized() else "left"
sys.stdout.write(f"trained {len(result.losses)} {state} {threads()}\\n")  # one write: the two processes share stdout
"""


@ON_PROC
def test_leaving_the_process_group_frees_it_and_a_script_trains_after(model_dir: Path) -> None:
    """A group kept alive past destroy_process_group keeps gloo's threads running into interpreter exit, where
    releasing the last collective's tensors aborts the process (SIGABRT) now and then. Then, in the same script,
    ``biasviz.training.train`` under torchrun: the processes join again, train together, and leave."""
    run = torchrun_script(GROUP_THEN_TRAIN, "group_then_train.py", model_dir)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("group freed") == 2, run.stdout
    assert run.stdout.count("trained 2 left") == 2, run.stdout
    assert "gloo" not in run.stdout, run.stdout  # pt_gloo_runloop, gloo_tcp_loop: joined, after either
    assert json.loads((model_dir / "api" / "training.json").read_text())["processes"] == 2


def test_a_failing_process_leaves_nothing_at_out(model_dir: Path) -> None:
    code = model_dir / "fails.py"
    code.write_text("import os\nimport torch\nfrom tests.nano_gpt import GPT, GPTConfig\n\n"
                    "class Failing(GPT):\n    def forward(self, idx):\n"
                    "        if os.environ.get('RANK') == '1':\n"
                    "            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB.')\n"
                    "        return super().forward(idx)\n\n"
                    "def make():\n    torch.manual_seed(0)\n"
                    "    return Failing(GPTConfig(vocab_size=300))\n")  # fmt: skip
    env = {"PYTHONPATH": str(CHECKOUT)}
    run = torchrun(["extract", "--model", f"{code}:make", "--samples", "4", "--seq-len", "32", "--text", "text.txt",
                    "--out", "failed.h5", "--quiet", "--device", "cpu"], model_dir, env)  # fmt: skip
    assert run.returncode != 0
    assert ("Error: process 1 failed: the GPU ran out of memory part-way through 'biasviz extract' (an allocation of "
            "2.00 GiB failed); try --summary") in run.stderr, run.stderr  # one line, what ran out and what to change
    assert "Error: another process failed" in run.stderr and "[rank1]: Traceback" not in run.stderr
    assert not (model_dir / "failed.h5").exists()
    assert not [p for p in model_dir.iterdir() if "failed.h5" in p.name]


RANK_WINDOWS = """import os
import torch


class RankWindows(torch.nn.Module):
    \"\"\"One SDPA call over a sliding window: 8 keys in process 0's samples, 4 in process 1's.\"\"\"

    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.embed, self.bias = torch.nn.Embedding(300, 16), bias

    def forward(self, idx):
        x = self.embed(idx).view(*idx.shape, 2, 8).transpose(1, 2)
        t = idx.shape[-1]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        kept = (j <= i) & (i - j < (8 if os.environ.get("RANK") == "0" else 4))
        mask = torch.where(kept, -0.1 * (i - j).float(), float("-inf")) if self.bias else kept
        return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def formed_again():
    torch.manual_seed(0)
    return RankWindows(False)


def streamed():
    torch.manual_seed(0)
    return RankWindows(True)
"""


@pytest.mark.parametrize("make", ["formed_again", "streamed"])
def test_processes_whose_samples_are_masked_differently_are_refused(model_dir: Path, make: str) -> None:
    """Each process measures one mask for its own samples; where the processes' differ (a mask formed again from
    the joined banks, or per-cell moments merged), every process refuses rather than summarise with process 0's."""
    (model_dir / "rank_windows.py").write_text(RANK_WINDOWS)
    run = torchrun(["extract", "--model", f"{model_dir / 'rank_windows.py'}:{make}", "--samples", "4", "--seq-len",
                    "16", "--resolution", "16", "--summary", "--text", "text.txt", "--out", f"{make}.h5", "--quiet",
                    "--device", "cpu"], model_dir, {"PYTHONPATH": str(CHECKOUT)})  # fmt: skip
    assert run.returncode != 0, run.stdout
    assert "Error: attention call 0 masked other cells" in run.stderr and "run it in one process" in run.stderr
    assert "[rank0]: Traceback" not in run.stderr and "[rank1]: Traceback" not in run.stderr, run.stderr
    assert not (model_dir / f"{make}.h5").exists()


def test_ddp_training_of_two_processes_writes_loadable_checkpoints(model_dir: Path) -> None:
    run = torchrun(["train", "--scheme", "alibi", "--steps", "4", "--seq-len", "32", "--batch-size", "2",
                    "--save-every", "2", "--corpus", "text.txt", "--out", "ddp", "--quiet", "--device", "cpu"],
                   model_dir)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("trained") == 1
    out = model_dir / "ddp"
    assert list(list_checkpoints(out)) == [0, 2, 4]  # the initialisation, every 2 steps, and the last
    record = json.loads((out / "training.json").read_text())
    assert record["processes"] == 2 and record["step"] == 4
    assert load_model(out).scheme == "alibi" and load_model(out / "checkpoint-2").scheme == "alibi"


# --- sweeps (one process) ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training run's layout: OUT/checkpoint-STEP/ for steps 10, 20, 30 (different weights each)."""
    root = tmp_path_factory.mktemp("sweep") / "run"
    for k, step in enumerate((10, 20, 30)):
        small_model("kerple-log", seed=k).save_pretrained(root / f"checkpoint-{step}")
    return root


def test_sweep_slices_equal_single_checkpoint_extracts(sweep_dir: Path, tmp_path: Path) -> None:
    windows = np.random.default_rng(0).integers(0, 97, size=(3, 24))
    extract_sweep(sweep_dir, "all", windows, tmp_path / "sweep.h5", layers="all", device="cpu", progress=False)
    with h5py.File(tmp_path / "sweep.h5") as f:
        assert list(f["checkpoint"][()]) == [10, 20, 30]
        assert f["layer_1/bias"].dims[0].label == "checkpoint" and f["layer_1/weights"].shape == (3, 3, 12, 24, 24)
        assert f["layer_1/bias"].shape == (3, 1, 12, 24, 24) and f.attrs["bias_shared"]  # context-free: stored once
        assert json.loads(f.attrs["checkpoint_sha256"]).keys() == {"10", "20", "30"}
        for index, step in enumerate((10, 20, 30)):
            single = tmp_path / f"single{step}.h5"
            extract(load_model(sweep_dir / f"checkpoint-{step}"), windows, single, layers="all", device="cpu",
                    progress=False)  # fmt: skip
            alone = datasets(single)
            assert np.array_equal(f["input_ids"][()], alone["input_ids"])
            for name in ("layer_0/bias", "layer_0/weights", "layer_1/bias", "layer_1/weights"):
                assert np.array_equal(f[name][index], alone[name], equal_nan=True), (step, name)


def test_sweep_files_plot_dynamics_and_diagnose_per_checkpoint(sweep_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    windows = np.random.default_rng(1).integers(0, 97, size=(2, 32))
    path = tmp_path / "s.h5"
    extract_sweep(sweep_dir, "first,last", windows, path, device="cpu", progress=False)
    rc, _, err = run_cli(["plot", "--scheme", "kerple-log", "--input", str(path), "--kind", "dynamics", "--format",
                          "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert rc == 0, err
    assert (tmp_path / "kerple-log_dynamics.png").stat().st_size > 10_000
    rc, _, err = run_cli(["plot", "--scheme", "kerple-log", "--input", str(path), "--step", "10", "--format", "png",
                          "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert rc == 0, err
    rc, _, err = run_cli(["plot", "--scheme", "kerple-log", "--input", str(path), "--step", "20"], capsys)
    assert rc == 1 and "holds steps 10, 30" in err
    rc, _, err = run_cli(["diagnose", str(path), "--json", str(tmp_path / "d.json"), "--out-dir", str(tmp_path),
                          "--format", "png"], capsys)  # fmt: skip
    assert rc == 0, err
    doc = json.loads((tmp_path / "d.json").read_text())["schemes"]["kerple-log"]
    assert [c["step"] for c in doc["checkpoints"]] == [10, 30]
    # a context-free relative scheme: 0 at every checkpoint (independent of the sweep code: it is the definition)
    assert all(h["toeplitz_residual"] == 0 and h["context_dependence"] == 0
               for c in doc["checkpoints"] for h in c["heads"])  # fmt: skip
    assert (tmp_path / "kerple-log_training.png").exists()


def test_choosing_checkpoints(sweep_dir: Path) -> None:
    available = list_checkpoints(sweep_dir)
    assert choose("all", available, sweep_dir) == [10, 20, 30]
    assert choose("first,last", available, sweep_dir) == [10, 30]
    assert choose("20, 10", available, sweep_dir) == [10, 20]
    with pytest.raises(UsageError, match="'25' is not all, first, last or one of the steps 10, 20, 30"):
        choose("25", available, sweep_dir)
    with pytest.raises(BiasvizError, match="train it with --save-every"):
        choose("all", {}, sweep_dir.parent)


def test_combine_refuses_parts_that_do_not_belong_together(tmp_path: Path) -> None:
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    ids = np.random.default_rng(2).integers(0, 97, size=(2, 16))
    extract(load_model_from(small_model("alibi")), ids, a, device="cpu", progress=False)
    extract(load_model_from(small_model("alibi")), ids[:, ::-1].copy(), b, device="cpu", progress=False)
    with pytest.raises(BiasvizError, match="different token windows"):
        combine([a, b], tmp_path / "c.h5", along="checkpoint", steps=[1, 2])
    assert not (tmp_path / "c.h5").exists()


def load_model_from(model):  # noqa: ANN001, ANN201
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter

    return BiasGPTAdapter(model, source="test")


def test_force_replaces_a_run_with_its_saved_checkpoints_but_nothing_foreign(sweep_dir: Path, tmp_path: Path) -> None:
    from biasviz.training.checkpoints import check_output

    run = tmp_path / "run"
    small_model("alibi").save_pretrained(run)
    small_model("alibi").save_pretrained(run / "checkpoint-100")
    check_output(run, force=True)  # a run of train --save-every: replaceable
    (run / "checkpoint-100" / "thesis.tex").write_text("mine")
    with pytest.raises(BiasvizError, match="holds files biasviz did not write"):
        check_output(run, force=True)
    (run / "checkpoint-100" / "thesis.tex").unlink()
    (run / "checkpoint-final").mkdir()
    with pytest.raises(BiasvizError, match="checkpoint-final"):
        check_output(run, force=True)


def test_summary_sweep_slices_equal_single_checkpoint_summaries(sweep_dir: Path, tmp_path: Path) -> None:
    from biasviz.extraction.summary import extract_summary

    windows = np.random.default_rng(0).integers(0, 97, size=(3, 24))
    extract_sweep(sweep_dir, "first,last", windows, tmp_path / "sweep.h5", summary=True, resolution=6, device="cpu",
                  progress=False)  # fmt: skip
    with h5py.File(tmp_path / "sweep.h5") as f:
        assert list(f["checkpoint"][()]) == [10, 30] and bool(f.attrs["summary"])
        assert f["layer_1/weights_mean"].shape == (2, 12, 6, 6)
        assert [d.label for d in f["layer_1/bias_profile"].dims] == ["checkpoint", "stat", "head", "distance"]
        for index, step in enumerate((10, 30)):
            single = tmp_path / f"single{step}.h5"
            extract_summary(load_model(sweep_dir / f"checkpoint-{step}"), windows, single, resolution=6,
                            device="cpu", progress=False)  # fmt: skip
            alone = datasets(single)
            for name in ("layer_1/bias_mean", "layer_1/weights_std", "layer_1/bias_profile"):
                assert np.array_equal(f[name][index], alone[name], equal_nan=True), (step, name)
            for field in ("context_dependence", "toeplitz_residual", "separability_residual"):
                got, want = f["layer_1/diagnostics"][index][field], alone["layer_1/diagnostics"][field]
                assert np.array_equal(got, want, equal_nan=True), (step, field)


@pytest.mark.parametrize("scheme", ["alibi", "cable"])
def test_torchrun_summary_equals_the_one_process_summary(
    model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """Per-cell moments of two processes joined exactly: the same file as one process (to float rounding)."""
    if scheme != "alibi":
        small_model(scheme, vocab_size=300).save_pretrained(model_dir / scheme)
    model = "model" if scheme == "alibi" else scheme
    base = ["extract", "--model", model, "--samples", "5", "--seq-len", "20", "--text", "text.txt", "--quiet",
            "--device", "cpu", "--summary", "--force"]  # fmt: skip
    common = [*base, "--resolution", "20"]
    run = torchrun([*common, "--out", f"{scheme}-two.h5"], model_dir)
    assert run.returncode == 0, run.stderr
    monkeypatch.chdir(model_dir)
    rc, _, err = run_cli([*common, "--out", f"{scheme}-one.h5"], capsys)
    assert rc == 0, err
    one, two = datasets(model_dir / f"{scheme}-one.h5"), datasets(model_dir / f"{scheme}-two.h5")
    assert_same_datasets(one, two, field_tol=(1e-9, 1e-12))
    if scheme != "alibi":  # the refusal below is the same for every scheme
        return
    rc, _, err = run_cli([*base, "--resolution", "10", "--out", "coarse.h5"], capsys)
    assert rc == 0, err  # one process: any resolution
    run = torchrun([*base, "--resolution", "10", "--out", "coarse2.h5"], model_dir)
    assert run.returncode == 1 and "exact per cell" in run.stderr and not (model_dir / "coarse2.h5").exists()


STREAMED = '''import torch


class Model(torch.nn.Module):
    """torch's MultiheadAttention over embeddings, a distance penalty as its float mask (a bias): streamed."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(300, 32)
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, ids):
        x = self.embed(ids)
        i = torch.arange(ids.shape[1], dtype=torch.float32)
        mask = -0.25 * (i[:, None] - i[None, :]).abs()
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


def make():
    torch.manual_seed(4)
    return Model().eval()
'''


def test_torchrun_summary_of_a_streamed_model_keeps_the_positional_logits(
    model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model summarised from what it streams (torch's MHA layer): two processes' sums of q, k, scores and bias,
    key profiles and sink shares joined in rank order give one process's file, and P is its definition."""
    import importlib.util

    import torch

    (model_dir / "streamed.py").write_text(STREAMED)
    t, n = 20, 5
    common = ["extract", "--model", "streamed.py:make", "--samples", str(n), "--seq-len", str(t), "--text", "text.txt",
              "--quiet", "--device", "cpu", "--summary", "--resolution", str(t), "--force"]  # fmt: skip
    run = torchrun([*common, "--out", "streamed-two.h5"], model_dir)
    assert run.returncode == 0, run.stderr
    monkeypatch.chdir(model_dir)
    rc, _, err = run_cli([*common, "--out", "streamed-one.h5"], capsys)
    assert rc == 0, err
    one, two = datasets(model_dir / "streamed-one.h5"), datasets(model_dir / "streamed-two.h5")
    for name in ("positional_mean", "positional_profile", "weights_key_profile", "sink_share", "scores_mean"):
        assert f"layer_0/{name}" in two, name
    assert_same_datasets(one, two, field_tol=(1e-6, 1e-7))
    # P, the key profile and the sink shares from their definitions, in float64 from the model's own projections
    spec = importlib.util.spec_from_file_location("streamed", model_dir / "streamed.py")
    assert spec is not None and spec.loader is not None
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    model, ids = code.make(), torch.from_numpy(two["input_ids"].astype(np.int64))
    with torch.no_grad():
        x = model.embed(ids).double()
        q, k, _ = (x @ model.attn.in_proj_weight.double().T + model.attn.in_proj_bias.double()).split(32, dim=-1)
        q, k = (z.view(n, t, 4, 8).transpose(1, 2).numpy() for z in (q, k))
    i = np.arange(t, dtype=np.float64)
    c, bias = 1 / np.sqrt(8), -0.25 * np.abs(i[:, None] - i[None, :])
    scores = c * np.einsum("ahid,ahjd->ahij", q, k) + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    cross = np.einsum("hid,hjd->hij", q.sum(0), k.sum(0)) - np.einsum("ahid,ahjd->hij", q, k)
    p = c * cross / (n * (n - 1)) + bias
    by_distance = np.stack([np.diagonal(p[0], -d).mean() for d in range(t)])  # head 0, over cells with i - j = d
    tol = {"rtol": 1e-5, "atol": 1e-5}
    np.testing.assert_allclose(two["layer_0/positional_mean"], p, **tol)
    np.testing.assert_allclose(two["layer_0/positional_profile"][0, 0], by_distance, **tol)
    np.testing.assert_allclose(two["layer_0/weights_key_profile"][0], weights.mean(axis=(0, 2)), **tol)
    np.testing.assert_allclose(two["layer_0/sink_share"], weights[:, :, :, 0].mean(-1), **tol)


RANK_BIAS = '''import os

import torch


class Model(torch.nn.Module):
    """One SDPA layer whose float mask adds -slope·(i - j), the slope set by the process it runs in: a bias the same
    for every sample of a process, and another in the next."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(300, 32)
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = (z.view(b, t, 4, 8).transpose(1, 2) for z in self.qkv(self.embed(ids)).chunk(3, -1))
        i = torch.arange(t, dtype=torch.float32)
        slope = 0.25 * (1 + int(os.environ.get("RANK", "0")))
        bias = (-slope * (i[:, None] - i[None, :])).masked_fill(i[None, :] > i[:, None], float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def make():
    torch.manual_seed(4)
    return Model().eval()
'''


def test_torchrun_refuses_a_bias_that_differs_between_processes(model_dir: Path) -> None:
    """Each process's samples add one bias, compared with its own first sample's; joined, process 0's would form every
    process's rows: a bias that differs between the processes is refused, said, not summarised as process 0's."""
    (model_dir / "rank_bias.py").write_text(RANK_BIAS)
    run = torchrun(["extract", "--model", "rank_bias.py:make", "--samples", "4", "--seq-len", "16", "--text",
                    "text.txt", "--quiet", "--device", "cpu", "--summary", "--resolution", "16", "--force", "--out",
                    "rank-bias.h5"], model_dir)  # fmt: skip
    assert run.returncode != 0
    assert "added another bias, for sample 2 than for the first" in run.stderr, run.stderr[-2000:]
    assert not (model_dir / "rank-bias.h5").exists()
