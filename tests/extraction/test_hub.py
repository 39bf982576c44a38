"""Checkpoint series of public models read from a local hub cache (biasviz.extraction.hub): Pythia-, BLOOM- and
OLMo-style revisions, revisions not on disk or on disk only in part, and ORG/NAME without --checkpoints.

Tiny random GPT-NeoX (Pythia's architecture, traced) and BLOOM (hooked) models are saved as several "revisions";
the stored attention weights are checked against transformers' own eager ``output_attentions``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from tests.conftest import run_cli
from tests.extraction.test_sweep import TEXT
from tests.series_models import save_revision, tiny_bloom, tiny_neox


def eager_weights(model: torch.nn.Module, ids: np.ndarray, layer: int) -> np.ndarray:
    """transformers' own eager attention probabilities of ``layer`` (the reference)."""
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        out = model(torch.from_numpy(ids).long(), output_attentions=True, use_cache=False)
    return out.attentions[layer].float().numpy()



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



def test_org_name_without_checkpoints_says_how_to_read_the_cache(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:  # fmt: skip
    rc, _, err = run_cli(["extract", "--model", "EleutherAI/pythia-tiny", "--out", str(tmp_path / "o.h5")], capsys)
    assert rc == 1 and "--model EleutherAI/pythia-tiny does not exist" in err and "with --checkpoints" in err
