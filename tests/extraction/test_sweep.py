"""Checkpoint series: folders of any common naming, revisions in a local hub cache, log:N, resuming a sweep.

Tiny random GPT-NeoX (Pythia's architecture, traced) and BLOOM (hooked) models are saved as several "revisions";
the stored attention weights are checked against transformers' own eager ``output_attentions``, the recorded
hashes against hashlib over the weight files, and log:N against lists worked out by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.extraction.sweep import extract_sweep, resolve_series
from biasviz.training.series import STEP_PATTERNS, log_spaced, parse_name
from tests.conftest import run_cli
from tests.series_models import VOCAB, save_revision, tiny_bloom, tiny_neox

TEXT = "def f(x):\n    return x * 2  # doubled\n" * 200
PYTHIA_STEPS = [0, *[2**k for k in range(10)], *range(1000, 143001, 1000)]  # Pythia's 154 revisions


def everything(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every dataset (with its bytes) and every root attribute of a file."""
    data: dict[str, np.ndarray] = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: data.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        attrs = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in f.attrs.items()}
    return data, attrs


def assert_same_file(a: Path, b: Path, may_differ: set[str]) -> None:
    da, aa = everything(a)
    db, ab = everything(b)
    assert da.keys() == db.keys()
    for name in da:
        assert da[name].dtype == db[name].dtype and da[name].tobytes() == db[name].tobytes(), name
    assert aa.keys() == ab.keys()
    assert {k for k in aa if aa[k] != ab[k]} <= may_differ


def eager_weights(model: torch.nn.Module, ids: np.ndarray, layer: int) -> np.ndarray:
    """transformers' own eager attention probabilities of ``layer`` (the reference)."""
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        out = model(torch.from_numpy(ids).long(), output_attentions=True, use_cache=False)
    return out.attentions[layer].float().numpy()


# --- names and log:N -----------------------------------------------------------------------------------------
def test_the_table_parses_its_own_examples_and_nothing_else() -> None:
    expected = {"checkpoint-1000": (1000, None), "global_step1000": (1000, None), "iter_0001000": (1000, None),
                "step_1000": (1000, None), "stage1-step1000-tokens4B": (1000, 4 * 10**9),
                "step1000": (1000, None)}  # fmt: skip
    assert {example: parse_name(example) for _, example, _ in STEP_PATTERNS} == expected
    assert parse_name("step1000-tokens4194B") == (1000, 4194 * 10**9)  # OLMo-7B's names have no stage
    for other in ("main", "checkpoint-final", "step-1000", "global_step", "v1.0", "stage1-step1000"):
        assert parse_name(other) is None, other


def test_log_spaced_picks_the_hand_computed_steps() -> None:
    # Pythia, log:10: step0, then 9 targets 1 * 143000^(k/8) = 1, 4.41, 19.5, 85.8, 378, 1669, 7363, 32477, 143000,
    # each the nearest present step in log: 1, 4, 16, 64, 512 (378: |ln 512/378| = 0.30 < |ln 378/256| = 0.39),
    # 2000, 7000, 32000, 143000
    assert log_spaced(PYTHIA_STEPS, 10) == [0, 1, 4, 16, 64, 512, 2000, 7000, 32000, 143000]
    # log:3 of Pythia: 0, then targets 1 and 143000 only
    assert log_spaced(PYTHIA_STEPS, 3) == [0, 1, 143000]
    # no step 0: targets 10, 100, 1000 over 10..1000; a cluster at the low end still gives N distinct steps
    assert log_spaced([10, 20, 30, 100, 1000], 3) == [10, 100, 1000]
    assert log_spaced([1, 2, 3, 1000], 3) == [1, 3, 1000]  # target 31.6: 3 (ln 10.5) beats 1000 (ln 31.6)
    assert log_spaced([5, 6], 9) == [5, 6] and log_spaced([5, 6, 7], 1) == [7]


# --- folders of checkpoints, one per naming pattern ---------------------------------------------------------------
@pytest.mark.parametrize(("names", "tokens"), [
    (["checkpoint-0", "checkpoint-50", "checkpoint-100"], None),
    (["global_step0", "global_step50", "global_step100"], None),
    (["iter_0000000", "iter_0000050", "iter_0000100"], None),
    (["step_0", "step_50", "step_100"], None),
    (["step0", "step50", "step100"], None),
    (["stage1-step0-tokens0B", "stage1-step50-tokens210B", "stage1-step100-tokens420B"], [0, 210e9, 420e9]),
])  # fmt: skip
def test_a_folder_of_checkpoints_of_each_naming(tmp_path: Path, names: list[str], tokens: list[float] | None) -> None:
    root = tmp_path / "run"
    for k, name in enumerate(names):
        tiny_bloom(k).save_pretrained(root / name)
    (root / "notes").mkdir()  # not a checkpoint: ignored
    windows = np.random.default_rng(0).integers(0, VOCAB, size=(2, 12))
    out = tmp_path / "s.h5"
    extract_sweep(root, "first,last", windows, out, device="cpu", progress=False)
    with h5py.File(out) as f:
        assert list(f["checkpoint"][()]) == [0, 100]
        assert [n.decode() if isinstance(n, bytes) else n for n in f.attrs["checkpoint_names"]] == [names[0], names[2]]
        want_tokens = [-1, -1] if tokens is None else [int(tokens[0]), int(tokens[2])]
        assert list(f.attrs["checkpoint_tokens"]) == want_tokens
        hashes = json.loads(f.attrs["checkpoint_sha256"])
        for step, name in ((0, names[0]), (100, names[2])):
            assert hashes[str(step)] == hashlib.sha256((root / name / "model.safetensors").read_bytes()).hexdigest()
    assert not (tmp_path / "s.h5.partial").exists()


def test_step_pattern_reads_other_names_and_is_checked(tmp_path: Path) -> None:
    root = tmp_path / "run"
    for k, name in enumerate(["ckpt-e1-s300", "ckpt-e2-s600"]):
        tiny_bloom(k).save_pretrained(root / name)
    with pytest.raises(BiasvizError, match="holds no checkpoints whose names give a step"):
        resolve_series(root, "all")
    series = resolve_series(root, "all", r"ckpt-e\d+-s(?P<step>\d+)")
    assert [(c.step, c.name) for c in series.chosen] == [(300, "ckpt-e1-s300"), (600, "ckpt-e2-s600")]
    with pytest.raises(UsageError, match="no named group 'step'"):
        resolve_series(root, "all", r"ckpt-e\d+-s(\d+)")
    with pytest.raises(UsageError, match="not a regular expression"):
        resolve_series(root, "all", r"ckpt-(?P<step>\d+")


# --- a hub cache ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A hub cache with Pythia-style, BLOOM-style and OLMo-style revisions of tiny random models."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    models: dict[str, torch.nn.Module] = {}
    for k, step in enumerate([0, 1, 2, 4, 8, 1000, 2000]):
        models[f"step{step}"] = tiny_neox(k)
        save_revision(cache, "EleutherAI/pythia-tiny", f"step{step}", models[f"step{step}"])
    for k, step in enumerate([1000, 2000, 3000]):
        models[f"global_step{step}"] = tiny_bloom(10 + k)
        save_revision(cache, "bigscience/bloom-tiny-intermediate", f"global_step{step}", models[f"global_step{step}"])
    for k, (step, tokens) in enumerate([(0, 0), (1000, 4), (2000, 8)]):
        name = f"stage1-step{step}-tokens{tokens}B"
        models[name] = tiny_neox(20 + k)
        save_revision(cache, "allenai/OLMo-tiny", name, models[name])
    (cache / "models--allenai--OLMo-tiny" / "refs" / "main").write_text("0" * 40)  # no step in the name: ignored
    (root / "text.txt").write_text(TEXT)
    return {"root": root, "cache": cache, "models": models}


def test_pythia_style_revisions_from_the_hub_cache(hub: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.chdir(hub["root"])
    rc, out, err = run_cli(["extract", "--model", "EleutherAI/pythia-tiny", "--checkpoints", "log:4", "--layer", "all",
                            "--samples", "2", "--seq-len", "16", "--text", "text.txt", "--device", "cpu", "--quiet",
                            "--out", "pythia.h5"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "4 checkpoints (steps 0, 1, 8, 2000)" in out  # 0; then targets 1, 44.7, 2000 -> 1, 8, 2000
    with h5py.File(hub["root"] / "pythia.h5") as f:
        assert list(f["checkpoint"][()]) == [0, 1, 8, 2000] and f.attrs["source_model"] == "EleutherAI/pythia-tiny"
        assert list(f.attrs["checkpoint_names"]) == ["step0", "step1", "step8", "step2000"]
        ids = f["input_ids"][()]
        for index, step in enumerate([0, 1, 8, 2000]):
            model = hub["models"][f"step{step}"]
            for layer in (0, 1):
                want = eager_weights(model, ids, layer)
                np.testing.assert_allclose(f[f"layer_{layer}/weights"][index], want, atol=2e-6)


def test_olmo_and_bloom_style_revisions_record_tokens_and_work_as_summaries(
    hub: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hub["cache"].parent / "home"))
    (hub["cache"].parent / "home").mkdir(exist_ok=True)
    if not (hub["cache"].parent / "home" / "hub").exists():
        (hub["cache"].parent / "home" / "hub").symlink_to(hub["cache"])  # HF_HOME/hub is the cache
    monkeypatch.chdir(hub["root"])
    common = ["--samples", "2", "--seq-len", "16", "--text", "text.txt", "--device", "cpu", "--quiet", "--force"]
    rc, _, err = run_cli(["extract", "--model", "allenai/OLMo-tiny", "--checkpoints", "all", *common, "--out",
                          "olmo.h5"], capsys)  # fmt: skip
    assert rc == 0, err
    with h5py.File(hub["root"] / "olmo.h5") as f:
        assert list(f["checkpoint"][()]) == [0, 1000, 2000]
        assert list(f.attrs["checkpoint_tokens"]) == [0, 4 * 10**9, 8 * 10**9]
    rc, _, err = run_cli(["extract", "--model", "bigscience/bloom-tiny-intermediate", "--checkpoints",
                          "global_step1000,3000", "--summary", *common, "--out", "bloom.h5"], capsys)  # fmt: skip
    assert rc == 0, err
    with h5py.File(hub["root"] / "bloom.h5") as f:
        assert list(f["checkpoint"][()]) == [1000, 3000] and bool(f.attrs["summary"])
        ids = f["input_ids"][()]
        for index, name in enumerate(["global_step1000", "global_step3000"]):
            want = eager_weights(hub["models"][name], ids, 1).mean(axis=0)  # per cell, the mean over samples
            causal = np.tril(np.ones((16, 16), dtype=bool))  # cells after the query are NaN in a summary map
            got = f["layer_1/weights_mean"][index]
            np.testing.assert_allclose(got[:, causal], want[:, causal], atol=2e-6)
            assert np.isnan(got[:, ~causal]).all()
        hashes = json.loads(f.attrs["checkpoint_sha256"])
        snapshot = next((hub["cache"] / "models--bigscience--bloom-tiny-intermediate" / "snapshots").iterdir())
        assert len(hashes) == 2 and all(len(h) == 64 for h in hashes.values()) and snapshot.is_dir()


def test_a_revision_not_on_disk_is_one_error_line_saying_how_to_fetch_it(
    hub: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline or not, nothing is fetched
    monkeypatch.chdir(hub["root"])
    base = ["extract", "--samples", "2", "--seq-len", "16", "--text", "text.txt", "--out", "never.h5"]
    for model, spec, named in [("EleutherAI/pythia-tiny", "step0,step3000", "step3000"),
                               ("EleutherAI/pythia-tiny", "3000", "step3000"),
                               ("bigscience/bloom-tiny-intermediate", "4000", "global_step4000")]:  # fmt: skip
        rc, _, err = run_cli([*base, "--model", model, "--checkpoints", spec], capsys)
        assert rc == 1 and err.count("\n") == 1 and err.startswith("Error: "), err
        assert f"revision {named} of {model} is not on disk" in err
        assert f"hf download {model} --revision {named}" in err
    rc, _, err = run_cli([*base, "--model", "someone/absent", "--checkpoints", "all"], capsys)
    assert rc == 1 and "holds no revisions of it" in err and "hf download someone/absent" in err
    assert not (hub["root"] / "never.h5").exists()


# --- resuming --------------------------------------------------------------------------------------------------
def _interrupt_after(monkeypatch: pytest.MonkeyPatch, module: str, name: str, calls: int) -> None:
    """Make the per-checkpoint extraction raise KeyboardInterrupt (a Ctrl-C) once ``calls`` have finished."""
    import importlib

    mod = importlib.import_module(module)
    real, count = getattr(mod, name), [0]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if count[0] == calls:
            raise KeyboardInterrupt
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, name, interrupted)


@pytest.mark.parametrize("summary", [False, True])
def test_a_resumed_sweep_equals_an_uninterrupted_one_bit_for_bit(
    hub: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, summary: bool
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    windows = np.random.default_rng(3).integers(0, VOCAB, size=(3, 12))
    options = {"layers": "all", "device": "cpu", "progress": False, "summary": summary}
    whole, out = tmp_path / "whole.h5", tmp_path / "resumed.h5"
    extract_sweep("EleutherAI/pythia-tiny", "all", windows, whole, **options)
    with monkeypatch.context() as m:
        _interrupt_after(m, "biasviz.extraction.summary" if summary else "biasviz.extraction.run",
                         "extract_summary" if summary else "extract", 3)  # fmt: skip
        with pytest.raises(KeyboardInterrupt, match="the 3 of 7 checkpoints finished are kept in .*--resume"):
            extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, **options)
    partial = tmp_path / "resumed.h5.partial"
    assert not out.exists() and sorted(p.name for p in partial.glob("step-*.h5")) == [
        "step-0.h5", "step-1.h5", "step-2.h5"]  # fmt: skip
    with pytest.raises(BiasvizError, match="holds an unfinished sweep .3 checkpoints done.; add --resume"):
        extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, **options)
    with pytest.raises(BiasvizError, match="--resume: .* was started with other settings .windows.sha256"):
        extract_sweep("EleutherAI/pythia-tiny", "all", windows[:, ::-1].copy(), out, resume=True, **options)
    with pytest.raises(BiasvizError, match="--resume: .* other settings .checkpoints was"):
        extract_sweep("EleutherAI/pythia-tiny", "first,last", windows, out, resume=True, **options)
    import biasviz.adapters as adapters

    # a finished part cut short (a disk that filled, a copy that stopped): one error naming it and the ways out
    damaged = partial / "step-1.h5"
    kept = damaged.read_bytes()
    damaged.write_bytes(kept[: len(kept) // 2])
    with pytest.raises(BiasvizError, match=r"--resume: checkpoint step1, finished by an earlier run, cannot be read "
                       r"from .*step-1\.h5 .*delete that file .*--resume .*--force") as err:  # fmt: skip
        extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, resume=True, **options)
    assert "\n" not in str(err.value)
    damaged.unlink()
    calls: list[Path] = []
    real_load = adapters.load_model
    monkeypatch.setattr(adapters, "load_model", lambda p, *a, **k: calls.append(Path(p)) or real_load(p, *a, **k))
    extract_sweep("EleutherAI/pythia-tiny", "all", windows, out, resume=True, **options)
    assert len(calls) == 5  # only the checkpoints missing were run: the four never run and the one deleted
    assert not partial.exists()
    assert_same_file(whole, out, may_differ={"created_utc"})


def test_resume_needs_an_unfinished_sweep(hub: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.chdir(hub["root"])
    base = ["extract", "--model", "EleutherAI/pythia-tiny", "--samples", "2", "--seq-len", "16", "--text", "text.txt"]
    rc, _, err = run_cli([*base, "--checkpoints", "all", "--resume", "--out", str(tmp_path / "r.h5")], capsys)
    assert rc == 1 and "no unfinished sweep" in err
    rc, _, err = run_cli([*base, "--resume", "--out", str(tmp_path / "r.h5")], capsys)
    assert rc == 2 and "--resume applies with --checkpoints" in err


def test_the_sweeps_page_shows_the_table_the_code_uses() -> None:
    from biasviz.training.series import pattern_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "sweeps.md").read_text(encoding="utf-8")
    assert pattern_table() in page


def test_a_revision_in_the_cache_only_in_part_is_left_out_or_named(
    hub: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    cache = tmp_path / "cache"
    save_revision(cache, "EleutherAI/pythia-part", "step0", tiny_neox(0))
    save_revision(cache, "EleutherAI/pythia-part", "step9", tiny_neox(1))
    snapshot = save_revision(cache, "EleutherAI/pythia-part", "step5", tiny_neox(2))
    (snapshot / "model.safetensors").unlink()  # a download that stopped half-way
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(hub["root"])
    base = ["extract", "--model", "EleutherAI/pythia-part", "--samples", "2", "--seq-len", "8", "--text", "text.txt",
            "--device", "cpu", "--quiet", "--out", str(tmp_path / "o.h5")]  # fmt: skip
    rc, _, err = run_cli([*base, "--checkpoints", "step5"], capsys)
    assert rc == 1 and "revision step5 of EleutherAI/pythia-part is in the cache only in part" in err
    assert "hf download EleutherAI/pythia-part --revision step5" in err
    rc, out, err = run_cli([*base, "--checkpoints", "all"], capsys)
    assert rc == 0 and "2 checkpoints (steps 0, 9)" in out, err
    assert "Warning: EleutherAI/pythia-part: revisions step5 are in the cache only in part" in err
    with h5py.File(tmp_path / "o.h5") as f:  # the file itself says what was left out, and why
        assert json.loads(f.attrs["checkpoints_left_out"]) == {
            "step5": "in the cache only in part (no config.json or weights)"}  # fmt: skip
        assert "checkpoints_identical" not in f.attrs
    rc, out, _ = run_cli(["info", str(tmp_path / "o.h5")], capsys)
    assert rc == 0 and [line.split(None, 2)[2] for line in out.splitlines() if line.strip().startswith("left out")] \
        == ["step5: in the cache only in part (no config.json or weights)"]  # fmt: skip


def test_checkpoints_with_byte_identical_weights_are_named_in_a_warning_and_in_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Published series have revisions equal to one another (a step branch equal to main): said, not hidden."""
    import shutil

    root = tmp_path / "run"
    tiny_bloom(0).save_pretrained(root / "checkpoint-0")
    tiny_bloom(1).save_pretrained(root / "checkpoint-50")
    shutil.copytree(root / "checkpoint-50", root / "checkpoint-100")  # the same weights under another step
    shutil.copytree(root / "checkpoint-0", root / "checkpoint-150")
    (tmp_path / "text.txt").write_text(TEXT)
    rc, _, err = run_cli(["extract", "--model", str(root), "--checkpoints", "all", "--samples", "2", "--seq-len", "8",
                          "--text", str(tmp_path / "text.txt"), "--device", "cpu", "--quiet", "--out",
                          str(tmp_path / "s.h5")], capsys)  # fmt: skip
    assert rc == 0, err
    sha = {n: hashlib.sha256((root / n / "model.safetensors").read_bytes()).hexdigest() for n in os.listdir(root)}
    want = [[a, b] for a in sorted(sha, key=lambda n: int(n.split("-")[1])) for b in sorted(sha, key=lambda n:
            int(n.split("-")[1])) if int(a.split("-")[1]) < int(b.split("-")[1]) and sha[a] == sha[b]]  # fmt: skip
    assert want == [["checkpoint-0", "checkpoint-150"], ["checkpoint-50", "checkpoint-100"]]
    with h5py.File(tmp_path / "s.h5") as f:
        assert json.loads(f.attrs["checkpoints_identical"]) == want
    warning = [line for line in err.splitlines() if "byte-identical" in line]
    assert len(warning) == 1 and "checkpoint-0 = checkpoint-150" in warning[0] and \
        "checkpoint-50 = checkpoint-100" in warning[0]  # fmt: skip
    rc, out, _ = run_cli(["info", str(tmp_path / "s.h5")], capsys)
    assert "checkpoint-0 = checkpoint-150; checkpoint-50 = checkpoint-100 (byte-identical weights)" in out


def test_org_name_without_checkpoints_says_how_to_read_the_cache(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:  # fmt: skip
    rc, _, err = run_cli(["extract", "--model", "EleutherAI/pythia-tiny", "--out", str(tmp_path / "o.h5")], capsys)
    assert rc == 1 and "--model EleutherAI/pythia-tiny does not exist" in err and "with --checkpoints" in err


def test_a_summary_sweep_of_rope_checkpoints_keeps_positional_logits_equal_to_single_runs(tmp_path: Path) -> None:
    """docs/positional.md over training: each checkpoint's slice of a sweep is that checkpoint summarised alone."""
    from biasviz.adapters.transformers_traced import load_transformers_sdpa
    from biasviz.extraction.summary import extract_summary

    root = tmp_path / "run"
    for k, name in enumerate(["step0", "step50", "step100"]):
        tiny_neox(k).save_pretrained(root / name)
    windows = np.random.default_rng(4).integers(0, VOCAB, size=(3, 16))
    extract_sweep(root, "all", windows, tmp_path / "sweep.h5", summary=True, resolution=8, layers="all",
                  device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "sweep.h5") as sweep:
        for index, name in enumerate(["step0", "step50", "step100"]):
            single = tmp_path / f"{name}.h5"
            extract_summary(load_transformers_sdpa(root / name), windows, single, layers="all", resolution=8,
                            device="cpu", progress=False)  # fmt: skip
            with h5py.File(single) as one:
                for layer in (0, 1):
                    for key in ("positional_mean", "positional_profile", "scores_mean", "weights_key_profile",
                                "sink_share"):  # fmt: skip
                        np.testing.assert_array_equal(sweep[f"layer_{layer}/{key}"][index],
                                                      one[f"layer_{layer}/{key}"][()], err_msg=f"{name} {key}")
