"""Hostile inputs, one table per class: what biasviz did not write is never replaced, every option is checked
before any work, foreign files and options that do not apply get one clear ``Error:`` line.

Each case asserts the exit code, exactly one stderr line matching its pattern, no traceback, and that
every file the user had (the shared inputs and the case's own folder) is byte for byte unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.hostile import TEXT, Case, make_assets, run_case


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_assets(tmp_path_factory.mktemp("hostile"))


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The case's own folder, also the working directory (defaults such as data/ land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


TRAIN = "train --scheme alibi --steps 1 --seq-len 8 --batch-size 1 --corpus {text} --device cpu --quiet"
EX = "extract --model {alibi} --text {text} --seq-len 8 --samples 1 --quiet"


Prepare = Callable[[Path, dict[str, str]], object]


def _files(contents: dict[str, str | bytes]) -> Prepare:
    """A ``prepare`` that writes files under {tmp} (names may hold folders: ``ck/config.json``)."""

    def prepare(tmp: Path, _paths: dict[str, str]) -> None:
        for name, content in contents.items():
            p = tmp / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content.encode() if isinstance(content, str) else content)

    return prepare


def _copy(key: str, name: str, extra: dict[str, str | bytes] | None = None) -> Prepare:
    """A ``prepare`` that copies the shared input ``key`` to {tmp}/NAME, then writes ``extra`` files inside it."""

    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        src = Path(paths[key])
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / name)
        _files({f"{name}/{rel}": content for rel, content in (extra or {}).items()})(tmp, paths)

    return prepare


def _symlink(name: str, key: str) -> Prepare:
    return lambda tmp, paths: (tmp / name).symlink_to(paths[key])


def _steps(*prepares: Prepare) -> Prepare:
    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        for step in prepares:
            step(tmp, paths)

    return prepare


# -- 1. never replace what biasviz did not write --------------------------------------------------------
NEVER_REPLACED = [
    Case("train --force over a folder of the user's", TRAIN + " --out {tmp}/thesis --force",
         r"thesis is not a biasviz checkpoint", prepare=_files({"thesis/thesis.tex": "\\documentclass{article}"})),
    Case("train --force over another model's checkpoint", TRAIN + " --out {tmp}/gpt2 --force",
         r"gpt2 is not a biasviz checkpoint",
         prepare=_files({"gpt2/config.json": '{"model_type": "gpt2"}', "gpt2/model.safetensors": b"\0" * 16})),
    Case("train --force over a checkpoint holding the user's notes", TRAIN + " --out {tmp}/ck --force",
         r"ck holds files biasviz did not write \(notes\.txt\)", prepare=_copy("alibi", "ck", {"notes.txt": "x"})),
    Case("train --force over a symbolic link", TRAIN + " --out {tmp}/link --force", r"link is a symbolic link",
         prepare=_symlink("link", "alibi")),
    Case("train --force over a config.json that is no biasviz config", TRAIN + " --out {tmp}/ck --force",
         r"ck is not a biasviz checkpoint", prepare=_files({"ck/config.json": "{}", "ck/model.safetensors": b""})),
    Case("diagnose --json over an existing file", "diagnose {good} --json {tmp}/mine.json --no-figures",
         r"mine\.json already exists; pass --force", prepare=_files({"mine.json": '{"mine": 1}'})),
    Case("diagnose --json over its own input, with --force", "diagnose {tmp}/in.h5 --json {tmp}/in.h5 --force "
         "--no-figures", r"in\.h5 is one of the input files", prepare=_copy("good", "in.h5")),
    Case("diagnose --json over its input spelled another way", "diagnose {tmp}/in.h5 --json {tmp}/sub/../in.h5 "
         "--force --no-figures", r"in\.h5 is one of the input files",
         prepare=_steps(_copy("good", "in.h5"), _files({"sub/keep": "k"}))),
    Case("diagnose default JSON already there", "diagnose {good} --out-dir {tmp}/figs --no-figures",
         r"diagnostics\.json already exists; pass --force", prepare=_files({"figs/diagnostics.json": "{}"})),
    Case("extract --out over its own --model, with --force", "extract --model {tmp}/m.pt --scheme alibi --text {text} "
         "--seq-len 8 --samples 1 --out {tmp}/m.pt --force", r"m\.pt is one of the input files",
         prepare=_copy("sd", "m.pt")),
    Case("extract --out over its own --text, with --force", "extract --model {alibi} --text {tmp}/t.txt --seq-len 8 "
         "--samples 1 --out {tmp}/t.txt --force", r"t\.txt is one of the input files",
         prepare=_files({"t.txt": TEXT})),
    Case("train --force over a checkpoint holding a subfolder", TRAIN + " --out {tmp}/ck --force",
         r"ck holds files biasviz did not write \(runs\)", prepare=_copy("alibi", "ck", {"runs/keep": "k"})),
    Case("train --out a file", TRAIN + " --out {tmp}/f.txt", r"f\.txt.* is a file", code=2,
         prepare=_files({"f.txt": "mine"})),
    Case("plot over a folder named like a figure", "plot --scheme alibi --input {good} --out-dir {tmp}/figs",
         r"alibi_bias\.png is a folder", prepare=_files({"figs/alibi_bias.png/keep": "mine"})),
    Case("diagnose over a folder named like a figure", "diagnose {good} --out-dir {tmp}/figs --format pdf",
         r"alibi_bias_profile\.pdf is a folder", prepare=_files({"figs/alibi_bias_profile.pdf/keep": "mine"})),
]  # fmt: skip


@pytest.mark.parametrize("case", NEVER_REPLACED, ids=str)
def test_never_replaces_what_biasviz_did_not_write(case: Case, paths: dict[str, str], tmp: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run_case(case, paths, tmp, capsys)


# -- 2. every option checked before any work ----------------------------------------------------------
def _config(text: str) -> Prepare:
    return _files({"c.toml": text.encode()})


BIG = "--samples 100000 --seq-len 1000000"
OPTIONS = [
    Case("learning rate nan", TRAIN + " --lr nan --out {tmp}/o", r"--lr must be a positive number", code=2),
    Case("learning rate negative", TRAIN + " --lr -0.1 --out {tmp}/o", r"--lr must be a positive number", code=2),
    Case("learning rate infinite", TRAIN + " --lr inf --out {tmp}/o", r"--lr must be a positive number", code=2),
    Case("learning rate zero", TRAIN + " --lr 0 --out {tmp}/o", r"--lr must be a positive number", code=2),
    Case("train seed negative", TRAIN + " --seed -1 --out {tmp}/o", r"--seed .*0 to 2\^63 - 1", code=2),
    Case("train seed 2^63", TRAIN + " --seed 9223372036854775808 --out {tmp}/o", r"--seed .*0 to 2\^63 - 1", code=2),
    Case("extract seed negative", EX + " --seed -5 --out {tmp}/o.h5", r"--seed .*0 to 2\^63 - 1", code=2),
    Case("extract seed huge", EX + " --seed 99999999999999999999 --out {tmp}/o.h5", r"--seed .*0 to 2\^63 - 1",
         code=2),
    Case("alibi slopes not numbers", TRAIN + " --scheme-options '{{\"slopes\": [\"a\", \"b\"]}}' --out {tmp}/o",
         r"alibi option 'slopes'.*numbers"),
    Case("alibi slopes too few", TRAIN + " --scheme-options '{{\"slopes\": [1, 2]}}' --out {tmp}/o",
         r"ALiBi needs one slope per head: got 2 for 12 heads"),
    Case("alibi slopes not finite", TRAIN + " --scheme-options '{{\"slopes\": " + str([1.0] * 11 + ["NaN"])
         .replace("'", '"') + "}}' --out {tmp}/o", r"alibi option 'slopes'.*finite"),
    Case("alibi slope rule unknown", TRAIN + " --scheme-options '{{\"slopes\": \"steep\"}}' --out {tmp}/o",
         r"unknown ALiBi slope rule 'steep'"),
    Case("t5 num_buckets 0", TRAIN + " --scheme t5 --scheme-options '{{\"num_buckets\": 0}}' --out {tmp}/o",
         r"t5 option 'num_buckets' must be an integer of at least 2"),
    Case("t5 num_buckets fractional", TRAIN + " --scheme t5 --scheme-options '{{\"num_buckets\": 2.5}}' --out {tmp}/o",
         r"t5 option 'num_buckets' must be an integer"),
    Case("t5 max_distance too small", TRAIN + " --scheme t5 --scheme-options '{{\"max_distance\": 4}}' --out {tmp}/o",
         r"t5 option 'max_distance' must be .*more than num_buckets / 2"),
    Case("fire hidden 0", TRAIN + " --scheme fire --scheme-options '{{\"hidden\": 0}}' --out {tmp}/o",
         r"fire option 'hidden' must be an integer of at least 1"),
    Case("fire hidden text", TRAIN + " --scheme fire --scheme-options '{{\"hidden\": \"wide\"}}' --out {tmp}/o",
         r"fire option 'hidden' must be an integer"),
    Case("fire init_c negative", TRAIN + " --scheme fire --scheme-options '{{\"init_c\": -1}}' --out {tmp}/o",
         r"fire option 'init_c' must be a positive number"),
    Case("fox gate unknown", TRAIN + " --scheme fox --scheme-options '{{\"gate\": \"half\"}}' --out {tmp}/o",
         r"unknown FoX gate 'half'"),
    Case("fox decay time negative", TRAIN + " --scheme fox --scheme-options '{{\"gate\": \"fixed\", "
         "\"decay_time_min\": -1, \"decay_time_max\": 8}}' --out {tmp}/o",
         r"'decay_time_min' must be a positive number"),
    Case("unknown scheme option", TRAIN + " --scheme kerple --scheme-options '{{\"r\": 1}}' --out {tmp}/o",
         r"unknown option\(s\) \['r'\] for scheme 'kerple-log'"),
    Case("windows beyond memory", EX + f" {BIG} --out {{tmp}}/o.h5", r"needs about .* of memory"),
    Case("batch beyond memory", EX.replace("--text {text} ", "") + " --seq-len 100000 --out {tmp}/o.h5",
         r"a batch of 1 x 12 heads x 100000 x 100000 needs about .* of memory"),
    Case("bias-only beyond memory", "extract --model {alibi} --bias-only --seq-len 10000000 --out {tmp}/o.h5",
         r"needs about .* of memory"),
    Case("train batch beyond memory", TRAIN + " --seq-len 100000 --batch-size 64 --out {tmp}/o",
         r"needs about .* of memory"),
    Case("config: fraction for an integer", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"samples = 2\.7 .*must be an integer", code=2, prepare=_config("[extract]\nsamples = 2.7\n")),
    Case("config: true for an integer", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"seq_len = true .*must be an integer", code=2, prepare=_config("seq_len = true\n")),
    Case("config: number for a flag", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"quiet = 1 .*must be true or false", code=2, prepare=_config("[extract]\nquiet = 1\n")),
    Case("config: text for a number", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"batch_size = '2' .*must be an integer", code=2, prepare=_config("[extract]\nbatch_size = '2'\n")),
    Case("config: number for a text", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"dtype = 16 .*must be text", code=2, prepare=_config("[extract]\ndtype = 16\n")),
    Case("config: unknown top-level key", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"unknown key 'sampels' .*known keys: .*samples", code=2, prepare=_config("sampels = 4\n")),
    Case("config: unknown table", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"unknown table \[extrakt\] .*known tables: .*extract", code=2, prepare=_config("[extrakt]\nsamples = 4\n")),
    Case("config: learning rate nan", TRAIN + " --config {tmp}/c.toml --out {tmp}/o",
         r"--lr must be a positive number", code=2, prepare=_config("[train]\nlr = nan\n")),
    Case("config is a folder", EX + " --config {tmp} --out {tmp}/o.h5", r"is a directory", code=2),
    Case("huge --layer", EX + " --layer 99999999999999999999 --out {tmp}/o.h5", r"--layer .* out of range"),
    Case("huge plot --sample", "plot --scheme alibi --input {good} --sample 99999999999999999999 --out-dir {tmp}/f",
         r"sample 99999999999999999999 .*holds 2 samples"),
    Case("huge plot --layer", "plot --scheme alibi --input {good} --layer 99999999999999999999 --out-dir {tmp}/f",
         r"layer 99999999999999999999 is not in .*good\.h5"),
    Case("huge diagnose --layer", "diagnose {good} --layer -99999999999999999999 --out-dir {tmp}/f",
         r"layer -99999999999999999999 out of range"),
    Case("negative batch size", EX + " --batch-size -1 --out {tmp}/o.h5", r"Invalid value for '--batch-size'", code=2),
    Case("samples 0", EX + " --samples 0 --out {tmp}/o.h5", r"Invalid value for '--samples'", code=2),
    Case("no figure formats", "plot --scheme alibi --input {good} --format , --out-dir {tmp}/f",
         r"unknown figure format"),
]  # fmt: skip


@pytest.mark.parametrize("case", OPTIONS, ids=str)
def test_options_are_checked_before_any_work(case: Case, paths: dict[str, str], tmp: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run_case(case, paths, tmp, capsys)
    assert not (tmp / "o").exists() and not (tmp / "o.h5").exists()


# -- 4. untrusted and foreign files --------------------------------------------------------------------
def _truncated_weights(tmp: Path, paths: dict[str, str]) -> None:
    shutil.copytree(paths["alibi"], tmp / "ck")
    data = (tmp / "ck" / "model.safetensors").read_bytes()
    (tmp / "ck" / "model.safetensors").write_bytes(data[: len(data) // 2])


def _weights_folder(tmp: Path, paths: dict[str, str]) -> None:
    shutil.copytree(paths["alibi"], tmp / "ck")
    (tmp / "ck" / "model.safetensors").unlink()
    (tmp / "ck" / "model.safetensors").mkdir()


def _state_dict_with(key: str, tensor: torch.Tensor, name: str = "bad.pt") -> Prepare:
    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        state = torch.load(paths["sd"], weights_only=True)
        state[key] = tensor
        if name.endswith(".safetensors"):
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / name))
        else:
            torch.save(state, tmp / name)

    return prepare


def _fifo(name: str) -> Prepare:
    def prepare(tmp: Path, _paths: dict[str, str]) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(tmp / name)

    return prepare


def _ckpt_with(files: dict[str, str | bytes]) -> Prepare:
    return _copy("alibi", "ck", files)


BINARY = bytes(range(256)) * 64
FOREIGN = [
    Case("checkpoint with truncated weights", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"model\.safetensors .*(truncated|damaged|not a readable)", prepare=_truncated_weights),
    Case("checkpoint with empty weights", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"model\.safetensors .*(truncated|damaged|not a readable)", prepare=_copy("alibi", "ck",
                                                                                 {"model.safetensors": b""})),
    Case("checkpoint config not UTF-8", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"config\.json is not UTF-8 text", prepare=_ckpt_with({"config.json": b'{"model_type": "\xff\xfe"}'})),
    Case("checkpoint config of the wrong types", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"cannot read the biasviz config in .*ck",
         prepare=_ckpt_with({"config.json": '{"model_type": "biasviz_gpt2", "scheme": "alibi", "n_head": "twelve"}'})),
    Case("checkpoint with bad scheme options", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"t5 option 'num_buckets' must be an integer of at least 2",
         prepare=_ckpt_with({"config.json": json.dumps({"model_type": "biasviz_gpt2", "scheme": "t5", "n_head": 12,
                                                    "n_embd": 48, "n_layer": 2, "vocab_size": 300,
                                                    "scheme_options": {"num_buckets": -3}})})),
    Case("checkpoint tokenizer that is JSON but no tokenizer", "extract --model {tmp}/ck --text {text} --seq-len 8 "
         "--samples 1 --out {tmp}/o.h5", r"tokenizer\.json is not a readable tokenizers JSON file",
         prepare=_ckpt_with({"tokenizer.json": '{"model": {"type": "nothing"}}'})),
    Case("--tokenizer JSON but no tokenizer", EX + " --tokenizer {tmp}/t.json --out {tmp}/o.h5",
         r"t\.json is not a readable tokenizers JSON file", prepare=_files({"t.json": '[1, 2, 3]'})),
    Case("--tokenizer empty", EX + " --tokenizer {tmp}/t.json --out {tmp}/o.h5",
         r"t\.json is not a readable tokenizers JSON file", prepare=_files({"t.json": ""})),
    Case("state dict: embedding of rank 1", "extract --model {tmp}/bad.pt --scheme alibi --out {tmp}/o.h5",
         r"transformer\.wte\.weight has shape \(300,\); expected 2 dimensions",
         prepare=_state_dict_with("transformer.wte.weight", torch.zeros(300))),
    Case("state dict: embedding of rank 0", "extract --model {tmp}/bad.pt --scheme alibi --out {tmp}/o.h5",
         r"transformer\.wte\.weight has shape \(\); expected 2 dimensions",
         prepare=_state_dict_with("transformer.wte.weight", torch.tensor(1.0))),
    Case("state dict: attention of rank 3", "extract --model {tmp}/bad.pt --scheme alibi --out {tmp}/o.h5",
         r"c_attn\.weight has shape \(144, 48, 1\)",
         prepare=_state_dict_with("transformer.h.0.attn.c_attn.weight", torch.zeros(144, 48, 1))),
    Case("state dict: layer norm of rank 2", "extract --model {tmp}/bad.pt --scheme alibi --out {tmp}/o.h5",
         r"ln_1\.weight has shape \(48, 1\), expected \(48,\)",
         prepare=_state_dict_with("transformer.h.1.ln_1.weight", torch.ones(48, 1))),
    Case("safetensors state dict of the wrong rank", "extract --model {tmp}/bad.safetensors --scheme alibi "
         "--out {tmp}/o.h5", r"transformer\.wte\.weight has shape \(300, 48, 1\); expected 2 dimensions",
         prepare=_state_dict_with("transformer.wte.weight", torch.zeros(300, 48, 1), "bad.safetensors")),
    Case("checkpoint weights that are a folder", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"model\.safetensors: Is a directory", prepare=_weights_folder),
    Case("checkpoint config.json a JSON list", "extract --model {tmp}/ck --out {tmp}/o.h5", r"names no model_type",
         prepare=_ckpt_with({"config.json": "[1, 2]"})),
    Case("config: scheme options a list", TRAIN + " --config {tmp}/c.toml --out {tmp}/o",
         r"scheme_options = \[1\] .*must be", code=2, prepare=_config("[train]\nscheme_options = [1]\n")),
    Case("empty state dict file", "extract --model {tmp}/e.pt --scheme alibi --out {tmp}/o.h5",
         r"e\.pt is not a readable PyTorch checkpoint", prepare=_files({"e.pt": ""})),
    Case("config file not UTF-8", EX + " --config {tmp}/c.toml --out {tmp}/o.h5", r"c\.toml is not UTF-8 text",
         code=2, prepare=_files({"c.toml": b"samples = 2 # \xff\xfe\n"})),
    Case("--text binary", EX + " --text {tmp}/b.txt --out {tmp}/o.h5", r"b\.txt is not UTF-8 text", code=0,
         level="Warning", prepare=_files({"b.txt": BINARY})),
    Case("--out is a folder", EX + " --out {tmp}/d", r"d is a folder; give a file path",
         prepare=_files({"d/keep": "k"})),
    Case("--out is a folder, with --force", EX + " --out {tmp}/d --force", r"d is a folder; give a file path",
         prepare=_files({"d/keep": "k"})),
    Case("info on a FIFO", "info {tmp}/f.h5", r"f\.h5 is not a regular file", prepare=_fifo("f.h5"),
         subprocess=True),
    Case("plot --input a FIFO", "plot --scheme alibi --input {tmp}/f.h5 --out-dir {tmp}/figs",
         r"f\.h5 is not a regular file", prepare=_fifo("f.h5"), subprocess=True),
    Case("--text a FIFO", EX + " --text {tmp}/f.txt --out {tmp}/o.h5", r"f\.txt is not a regular file",
         prepare=_fifo("f.txt")),
    Case("--tokenizer a FIFO", EX + " --tokenizer {tmp}/t.json --out {tmp}/o.h5", r"t\.json is not a regular file",
         prepare=_fifo("t.json"), subprocess=True),
    Case("--config a FIFO", EX + " --config {tmp}/c.toml --out {tmp}/o.h5", r"c\.toml is not a regular file",
         code=2, prepare=_fifo("c.toml"), subprocess=True),
    Case("--model a FIFO", "extract --model {tmp}/m.pt --scheme alibi --out {tmp}/o.h5",
         r"m\.pt is not a regular file", prepare=_fifo("m.pt")),
    Case("checkpoint config.json a FIFO", "extract --model {tmp}/ck --out {tmp}/o.h5",
         r"config\.json is not a regular file",
         prepare=_steps(_files({"ck/tokenizer.json": "{}"}), _fifo("ck/config.json"))),
    Case("train --corpus a FIFO", TRAIN.replace("{text}", "{tmp}/f.txt") + " --out {tmp}/o",
         r"f\.txt is not a regular file", prepare=_fifo("f.txt")),
    Case("info on /dev/zero", "info /dev/zero", r"/dev/zero is not a regular file", subprocess=True),
    Case("--config /dev/zero", EX + " --config /dev/zero --out {tmp}/o.h5", r"/dev/zero is not a regular file",
         code=2, subprocess=True),
    Case("--text /dev/null", EX + " --text /dev/null --out {tmp}/o.h5", r"/dev/null is not a regular file"),
    Case("--model a symlink loop", "extract --model {tmp}/loop --out {tmp}/o.h5", r"loop does not exist",
         prepare=lambda t, _p: (t / "loop").symlink_to(t / "loop")),
    Case("info on an empty file", "info {tmp}/e.h5", r"e\.h5 is not a readable HDF5 file",
         prepare=_files({"e.h5": ""})),
]  # fmt: skip


@pytest.mark.parametrize("case", FOREIGN, ids=str)
def test_foreign_files_get_one_clear_line(case: Case, paths: dict[str, str], tmp: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run_case(case, paths, tmp, capsys)
    if case.level == "Error":
        assert not (tmp / "o.h5").exists()


# -- 5. options that cannot apply say so ---------------------------------------------------------------
NOT_APPLICABLE = [
    Case("--no-scale on a checkpoint that records its scale", EX + " --no-scale --out {tmp}/o.h5",
         r"--no-scale .*config\.json records"),
    Case("--part on a biasviz checkpoint", EX + " --part decoder --out {tmp}/o.h5",
         r"--part applies to encoder-decoder models \(T5\)"),
    Case("--part on a state dict", "extract --model {sd} --scheme alibi --part encoder --out {tmp}/o.h5",
         r"--part applies to encoder-decoder models \(T5\)"),
    Case("--part from a config file", EX + " --config {tmp}/c.toml --out {tmp}/o.h5",
         r"--part applies to encoder-decoder models \(T5\)",
         prepare=_files({"c.toml": "[extract]\npart = 'encoder'\n"})),
    Case("--text with --bias-only", "extract --model {alibi} --bias-only --text {text} --out {tmp}/o.h5",
         r"--text .*--bias-only", code=2),
    Case("--tokenizer with --bias-only", "extract --model {alibi} --bias-only --tokenizer {alibi} --out {tmp}/o.h5",
         r"--tokenizer .*--bias-only", code=2),
    Case("--no-scale with --bias-only", "extract --model {sd} --scheme alibi --no-scale --bias-only "
         "--out {tmp}/o.h5", r"--no-scale .*--bias-only", code=2),
    Case("--log with the bias", "plot --scheme alibi --input {good} --log --out-dir {tmp}/f",
         r"--log applies to attention weights", code=2),
    Case("figure options with --no-figures", "diagnose {good} --no-figures --format svg --json {tmp}/d.json",
         r"--format .*--no-figures", code=2),
]  # fmt: skip


@pytest.mark.parametrize("case", NOT_APPLICABLE, ids=str)
def test_options_that_cannot_apply_say_so(case: Case, paths: dict[str, str], tmp: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    run_case(case, paths, tmp, capsys)
