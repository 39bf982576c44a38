"""An output never replaces an input: every command, every file it reads, ``--force`` or not.

Each case points an output (``--out``, ``--json``, a figure in ``--out-dir``, a checkpoint folder) at one of
the command's own inputs, spelled directly, through a symbolic or hard link, or as a folder that holds
it. The command must refuse with one ``Error:`` line, and every file must be as it was.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.hostile import Case, make_assets, run_case
from tests.project.test_hostile import EX, TRAIN, Prepare, _copy, _files, _steps

INPUT = r"is one of the input files|is inside an input folder|holds an input"
SMALL = "--seq-len 8 --samples 1 --quiet"


def _hardlink(name: str, target: str) -> Prepare:
    return lambda d, _p: os.link(d / target, d / name)


def _symlink_in_tmp(name: str, target: str) -> Prepare:
    return lambda d, _p: (d / name).symlink_to(d / target)


def _h5_named(name: str) -> Prepare:
    return lambda d, p: shutil.copy(p["good"], d / name)


def _factory(d: Path, p: dict[str, str]) -> None:
    (d / "code.py").write_text(
        "from biasviz.model import BiasGPTForCausalLM\n"
        f"def make():\n    return BiasGPTForCausalLM.from_pretrained({p['alibi']!r})\n"
    )


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_assets(tmp_path_factory.mktemp("outputs"))


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # defaults such as data/ land in the case's own folder
    return tmp_path


INPUT_KEPT = [
    Case("extract --out over the checkpoint's weights", "extract --model {tmp}/ck --text {text} " + SMALL
         + " --out {tmp}/ck/model.safetensors --force", INPUT, prepare=_copy("alibi", "ck")),
    Case("extract --out over the checkpoint's tokenizer", "extract --model {tmp}/ck --text {text} " + SMALL
         + " --out {tmp}/ck/tokenizer.json --force", INPUT, prepare=_copy("alibi", "ck")),
    Case("extract --out over its --tokenizer", EX + " --tokenizer {tmp}/tok.json --out {tmp}/tok.json --force",
         INPUT, prepare=lambda d, p: shutil.copy(Path(p["alibi"]) / "tokenizer.json", d / "tok.json")),
    Case("extract --out over its --config", "extract --config {tmp}/c.toml --out {tmp}/c.toml --force", INPUT,
         prepare=lambda d, p: (d / "c.toml").write_text(
             f'model = "{p["alibi"]}"\ntext = "{p["text"]}"\nseq_len = 8\nsamples = 1\n')),
    Case("extract --out a symbolic link to its --text", "extract --model {alibi} --text {tmp}/t.txt " + SMALL
         + " --out {tmp}/link.h5 --force", INPUT, prepare=_steps(_files({"t.txt": "x = 1\n" * 400}),
                                                              _symlink_in_tmp("link.h5", "t.txt"))),
    Case("extract --out a hard link to its --text", "extract --model {alibi} --text {tmp}/t.txt " + SMALL
         + " --out {tmp}/hard.h5 --force", INPUT, prepare=_steps(_files({"t.txt": "x = 1\n" * 400}),
                                                              _hardlink("hard.h5", "t.txt"))),
    Case("extract --out over its --model code", "extract --model {tmp}/code.py:make --text {text} " + SMALL
         + " --out {tmp}/code.py --force", INPUT, prepare=_factory),
    Case("extract --out inside a text folder it reads", "extract --model {alibi} --text {tmp}/corpus " + SMALL
         + " --out {tmp}/corpus/a.py --force", INPUT, prepare=_files({"corpus/a.py": "x = 1\n" * 400})),
    Case("explore --out over its file", "explore {tmp}/in.h5 --out {tmp}/in.h5 --force", INPUT,
         prepare=_copy("good", "in.h5")),
    Case("explore --out over the file it compares with", "explore {good} {tmp}/b.h5 --out {tmp}/b.h5 --force",
         INPUT, prepare=_copy("good", "b.h5")),
    Case("explore --out over its --tokenizer", "explore {good} --tokenizer {tmp}/tok.json --out {tmp}/tok.json "
         "--force", INPUT, prepare=lambda d, p: shutil.copy(Path(p["alibi"]) / "tokenizer.json", d / "tok.json")),
    Case("explore --out a hard link to its file", "explore {tmp}/in.h5 --out {tmp}/page.html --force", INPUT,
         prepare=_steps(_copy("good", "in.h5"), _hardlink("page.html", "in.h5"))),
    Case("plot over an input named like its figure", "plot --scheme alibi --input {tmp}/alibi_bias.png "
         "--out-dir {tmp} --format png", INPUT, prepare=_h5_named("alibi_bias.png")),
    Case("diagnose over an input named like its figure", "diagnose {tmp}/alibi_bias_profile.pdf --out-dir {tmp} "
         "--format pdf --force", INPUT, prepare=_h5_named("alibi_bias_profile.pdf")),
    Case("diagnose --json a symbolic link to its input", "diagnose {tmp}/in.h5 --json {tmp}/d.json --force "
         "--no-figures", INPUT, prepare=_steps(_copy("good", "in.h5"), _symlink_in_tmp("d.json", "in.h5"))),
    Case("train --force over the checkpoint holding its --tokenizer", TRAIN.replace(" --quiet", "")
         + " --tokenizer {tmp}/ck/tokenizer.json --out {tmp}/ck --force --quiet", INPUT, prepare=_copy("alibi", "ck")),
    Case("train --force over the checkpoint holding its --corpus", "train --scheme alibi --steps 1 --seq-len 8 "
         "--batch-size 1 --corpus {tmp}/ck/config.json --device cpu --quiet --out {tmp}/ck --force", INPUT,
         prepare=_copy("alibi", "ck")),
]  # fmt: skip


@pytest.mark.parametrize("case", INPUT_KEPT, ids=str)
def test_an_output_never_replaces_an_input(case: Case, paths: dict[str, str], tmp: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run_case(case, paths, tmp, capsys)


def test_table_size() -> None:
    assert len(INPUT_KEPT) >= 8
