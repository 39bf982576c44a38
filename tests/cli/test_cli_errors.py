"""Every user mistake ends in exactly one ``Error:`` line on stderr and a non-zero exit, never a traceback.

One table: each case is the command line (with ``{placeholders}`` for files the module fixture
makes), the expected exit code (2 for usage errors) and a pattern the single stderr line must
match. Most cases run in-process through :func:`biasviz.cli.main`; a few run the installed
``biasviz`` script in a subprocess, to prove that no traceback reaches a terminal.
Cases already covered elsewhere (``--layer 7`` on extract, plot's ``--scheme`` mismatch, ...)
are not repeated here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import pytest
import torch

from biasviz.cli import main
from biasviz.data import build_tokenizer, save_tokenizer
from tests.conftest import small_model

TEXT = "\n".join(f"def g{i}(y):\n    return y - {i} * {i + 1}  # row {i}" for i in range(300))
BIASVIZ = Path(sys.executable).with_name("biasviz")
NO_CUDA = not torch.cuda.is_available()


def _state_dict(scheme: str = "alibi", **overrides: object) -> dict[str, torch.Tensor]:
    """A nanoGPT-named state dict of a small model (keys transformer.h.N.*)."""
    out = {}
    for k, v in small_model(scheme, **overrides).state_dict().items():
        if k.startswith("lm_head"):
            continue
        k = re.sub(r"^blocks\.", "transformer.h.", k)
        k = re.sub(r"^embed\.", "transformer.wte.", k)
        k = re.sub(r"^pos_embed\.", "transformer.wpe.", k)
        k = re.sub(r"^ln_f\.", "transformer.ln_f.", k)
        out[k] = v
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Checkpoints, text and HDF5 files, good and bad, shared by every case."""
    root = tmp_path_factory.mktemp("errors")
    (root / "text.txt").write_text(TEXT)
    tok = build_tokenizer([TEXT], 300)
    small_model("alibi", vocab_size=300).save_pretrained(root / "alibi")
    save_tokenizer(tok, root / "alibi")
    small_model("learned", vocab_size=300, n_positions=32).save_pretrained(root / "learned")
    save_tokenizer(tok, root / "learned")
    (root / "notes.pt").write_text("these are my notes, not tensors\n")
    (root / "notes.txt").write_text("plain text\n")
    bad = _state_dict()
    bad["transformer.h.0.attn.c_attn.weight"] = torch.zeros(100, 48)  # fits neither (3C, C) nor (C, 3C)
    torch.save(bad, root / "shapes.pt")
    torch.save({"model": _state_dict("nope"), "model_args": {"n_head": 5}}, root / "heads.pt")  # 48 % 5 != 0
    torch.save({"step": 3, "loss": 1.5}, root / "notensors.pt")
    (root / "unreadable.pt").write_bytes(torch.zeros(1).numpy().tobytes())
    os.chmod(root / "unreadable.pt", 0)
    good = root / "good.h5"
    main(["extract", "--model", str(root / "alibi"), "--text", str(root / "text.txt"), "--seq-len", "16",
          "--samples", "2", "--out", str(good), "--quiet"])  # fmt: skip
    data = good.read_bytes()
    (root / "truncated.h5").write_bytes(data[: len(data) // 2])
    (root / "empty.h5").write_bytes(b"")
    shutil.copy(good, root / "v2.h5")
    with h5py.File(root / "v2.h5", "a") as f:
        f.attrs["biasviz_format"] = 2
    shutil.copy(good, root / "nolayer.h5")
    with h5py.File(root / "nolayer.h5", "a") as f:
        del f["layer_1"]
    with h5py.File(root / "plain.h5", "w") as f:
        f["x"] = [1, 2, 3]
    return {p.stem if p.is_file() else p.name: str(p) for p in root.iterdir()} | {"root": str(root)}


@dataclass
class Case:
    name: str
    argv: str  # split on spaces after formatting with the fixture's paths
    code: int
    pattern: str
    subprocess: bool = False
    skip: str | None = None


EX = "extract --model {alibi} --text {text} --seq-len 16 --samples 2"
CASES = [
    # checkpoints
    Case("missing checkpoint", "extract --model {root}/nowhere.pt --out {root}/o.h5", 1,
         r"--model .*nowhere\.pt does not exist; give a checkpoint directory", subprocess=True),
    Case("unreadable checkpoint", "extract --model {unreadable} --scheme alibi --out {root}/o.h5", 1,
         r"cannot (access|read) .*unreadable\.pt|not a readable PyTorch checkpoint: .*Permission denied",
         skip="root reads every file" if os.geteuid() == 0 else None),
    Case("text file named .pt", "extract --model {notes} --scheme alibi --out {root}/o.h5", 1,
         r"notes\.pt is not a readable PyTorch checkpoint"),
    Case("text file, unknown kind", "extract --model {root}/notes.txt --out {root}/o.h5", 1,
         r"cannot tell what .*notes\.txt is: give a checkpoint directory"),
    Case("pickle without tensors", "extract --model {notensors} --scheme alibi --out {root}/o.h5", 1,
         r"holds no tensors; expected a state dict"),
    Case("shapes fit no variant", "extract --model {shapes} --scheme alibi --out {root}/o.h5", 1,
         r"c_attn\.weight has shape \(100, 48\), expected \(144, 48\)"),
    Case("width not divisible by heads", "extract --model {heads} --scheme nope --out {root}/o.h5", 1,
         r"width 48 is not divisible by 5 heads"),
    # options
    Case("unknown scheme (extract)", EX + " --scheme nosuch --out {root}/o.h5", 1,
         r"unknown scheme 'nosuch'; valid schemes: alibi, cable, fire, .*t5"),
    Case("unknown scheme (train)", "train --scheme bogus --out {root}/t", 1,
         r"unknown scheme 'bogus'; valid schemes: .*kerple-log.*nope"),
    Case("seq-len beyond learned positions",
         "extract --model {learned} --text {text} --seq-len 40 --samples 1 --out {root}/o.h5", 1,
         r"--seq-len 40 exceeds the 32 positions of this 'learned' model.*use --seq-len 32 or less", subprocess=True),
    Case("layer list out of range", EX + " --layer 0,9 --out {root}/o.h5", 1,
         r"--layer 9 out of range: the model has 2 layers"),
    Case("plot layer out of range", "plot --scheme alibi --input {good} --layer -3 --out-dir {root}/f", 1,
         r"layer -3 out of range; .*good\.h5 holds layers \[1\]"),
    Case("diagnose layer not stored", "diagnose {good} --layer 0 --out-dir {root}/f", 1,
         r"layer 0 is not in .*good\.h5; it holds layers \[1\]"),
    Case("CUDA without a GPU (train)", "train --scheme alibi --device cuda --out {root}/t", 1,
         r"--device cuda asked for CUDA, but no CUDA GPU is available; use --device cpu",
         skip=None if NO_CUDA else "a GPU is present"),
    Case("unknown device", EX + " --device tpu --out {root}/o.h5", 1, r"unsupported device 'tpu'|unknown device"),
    Case("missing text", "extract --model {alibi} --text {root}/none.txt --out {root}/o.h5", 1,
         r"corpus path .*none\.txt does not exist"),
    Case("missing tokenizer", EX + " --tokenizer {root}/none.json --out {root}/o.h5", 1, r"no tokenizer at"),
    # HDF5 inputs
    Case("truncated HDF5", "info {truncated}", 1, r"truncated\.h5 is not a readable HDF5 file \(truncated",
         subprocess=True),
    Case("empty HDF5", "plot --scheme alibi --input {empty} --out-dir {root}/f", 1, r"not a readable HDF5 file"),
    Case("HDF5 but not biasviz", "plot --scheme alibi --input {plain} --out-dir {root}/f", 1,
         r"plain\.h5 is an HDF5 file but not a biasviz file"),
    Case("format version 2", "info {v2}", 1, r"v2\.h5 is biasviz format 2; this biasviz reads format 1 \(upgrade"),
    Case("listed layer missing", "diagnose {nolayer} --out-dir {root}/f", 1,
         r"lists layer 1 but has no layer_1/weights"),
    Case("missing input (plot default)", "plot --scheme kerple --input {root}/none.h5 --out-dir {root}/f", 1,
         r"none\.h5 does not exist; run 'biasviz extract' first"),
    # outputs
    Case("output folder is a file", EX + " --out {text}/sub/o.h5", 1,
         r"cannot create the output folder .*text\.txt"),
    Case("output folder not creatable", "plot --scheme alibi --input {good} --out-dir /proc/biasviz-none/f", 1,
         r"cannot create the output folder /proc/biasviz-none/f"),
    Case("existing output without --force", EX + " --out {good}", 1, r"good\.h5 already exists; pass --force"),
    # usage errors: exit 2
    Case("missing --model", "extract --samples 2", 2, r"Missing option '--model'.*biasviz extract --help",
         subprocess=True),
    Case("samples 0", EX + " --samples 0 --out {root}/o.h5", 2, r"Invalid value for '--samples'"),
    Case("bad --layer spelling", EX + " --layer last --out {root}/o.h5", 2, r"--layer takes -1, an index"),
    Case("bad --kind", "plot --scheme alibi --kind heat", 2, r"Invalid value for '--kind'"),
    Case("normalize with weights", "plot --scheme alibi --input {good} --kind weights --normalize diagonal", 2,
         r"--normalize diagonal applies to the bias"),
    Case("info on a folder", "info {root}", 2, r"is a directory"),
    Case("info without a file", "info", 2, r"Missing argument 'FILE'"),
    Case("missing --config file", EX + " --config {root}/none.toml", 2, r"config file .*none\.toml does not exist"),
    Case("unknown command", "extrakt --model x", 2, r"No such command 'extrakt'"),
]


def _argv(case: Case, env: dict[str, str]) -> list[str]:
    return case.argv.format(**env).split()


def _check_stderr(err: str, case: Case) -> None:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"{case.name}: expected one line, got {lines}"
    assert lines[0].startswith("Error: "), lines[0]
    assert re.search(case.pattern, lines[0]), f"{case.name}: {lines[0]!r} does not match {case.pattern!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_user_mistake_is_one_error_line(case: Case, env: dict[str, str], capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if case.skip:
        pytest.skip(case.skip)
    monkeypatch.chdir(env["root"])
    before = sorted(p.name for p in Path(env["root"]).iterdir())
    argv = _argv(case, env)
    if case.subprocess:
        proc = subprocess.run([str(BIASVIZ), *argv], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "200"})  # fmt: skip
        code, err = proc.returncode, proc.stderr
    else:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(argv)
        code, err = exc.value.code, capsys.readouterr().err
    assert code == case.code, (case.name, code, err)
    _check_stderr(err, case)
    assert sorted(p.name for p in Path(env["root"]).iterdir()) == before  # a failed command leaves nothing


def test_table_size() -> None:
    """The table covers at least the issue's list; its size is quoted in the change notes."""
    assert len(CASES) >= 30
    assert len({c.name for c in CASES}) == len(CASES)


def test_debug_shows_the_traceback(env: dict[str, str]) -> None:
    proc = subprocess.run([str(BIASVIZ), "--debug", "info", env["v2"]], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "BiasvizError" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: ")


def test_os_error_that_escapes_becomes_one_line(env: dict[str, str], capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An OSError no command anticipated (here: a full disk while saving a figure's temporary file)."""
    import errno

    from matplotlib.figure import Figure

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/somewhere/fig.png")

    monkeypatch.setattr("biasviz.plotting.save._save_one", full)
    monkeypatch.setattr(Figure, "savefig", full)
    with pytest.raises(SystemExit) as exc:
        main(["plot", "--scheme", "alibi", "--input", env["good"], "--out-dir", env["root"] + "/figs",
              "--format", "png"])  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 1
    _check_stderr(err, Case("full disk", "", 1, r"fig\.png: no space left \(the disk is full\); free some space"))
    shutil.rmtree(env["root"] + "/figs", ignore_errors=True)


def test_unexpected_exception_still_has_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug is not a user mistake: it must stay reportable, so main() lets it through."""

    def broken(*_a: object, **_k: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("biasviz.cli.schemes_cmd.click.echo", broken)
    with pytest.raises(ZeroDivisionError):
        main(["schemes"])
