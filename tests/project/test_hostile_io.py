"""Hostile environments and files, one table per class: failing writes, HDF5 files that would hang a reader,
and provenance that names the files it read.

Write failures are real where the machine allows it: a file-size limit (RLIMIT_FSIZE, the kernel then
fails writes with EFBIG), a directory no one may write to (``chattr +i``, which binds root too, else
``chmod``), a file system that refuses files (/sys). The previous output must stay as it was.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.hostile import Case, make_assets, run, run_case

Prepare = Callable[[Path, dict[str, str]], object]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hostile_io")
    found = make_assets(root)
    from biasviz.cli import main

    with contextlib.suppress(SystemExit):  # old outputs to be kept: a figure set, diagnostics, a checkpoint
        main(["plot", "--scheme", "alibi", "--input", found["good"], "--kind", "all", "--out-dir", str(root / "figs")])
    with contextlib.suppress(SystemExit):
        main(["diagnose", found["good"], "--out-dir", str(root / "figs"), "--format", "pdf"])
    return found | {"figs": str(root / "figs")}


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for p in [tmp_path, *tmp_path.rglob("*")]:  # let pytest remove what a case made read-only
        if p.is_dir() and not p.is_symlink():
            subprocess.run(["chattr", "-i", str(p)], capture_output=True, check=False)
            p.chmod(0o755)


def _copy(key: str, name: str) -> Prepare:
    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        src = Path(paths[key])
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / name)

    return prepare


def _read_only(*prepares: Prepare, folder: str = "ro") -> Prepare:
    """Run ``prepares`` (which fill {tmp}/FOLDER), then make FOLDER unwritable, even for root when possible."""

    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        for step in prepares:
            step(tmp, paths)
        (tmp / folder).mkdir(parents=True, exist_ok=True)
        (tmp / folder).chmod(0o555)
        if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(tmp / folder)], capture_output=True).returncode:
            pytest.skip("root writes anywhere and chattr +i is not available here")

    return prepare


def _file_size_limit(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


TRAIN = "train --scheme alibi --steps 1 --seq-len 8 --batch-size 1 --corpus {text} --device cpu --quiet"
EX = "extract --model {alibi} --text {text} --seq-len 8 --samples 1 --quiet"
NO_SPACE = r"no space left \(the file exceeds the allowed file size\)"
DENIED = r"(Permission denied|Operation not permitted|Read-only file system); check its permissions"

# (case, file-size limit in bytes for the subprocess; 0: none)
WRITE_FAILURES = [
    (Case("extract --force: file-size limit", EX + " --force --out {tmp}/o.h5", rf"o\.h5: {NO_SPACE}",
          prepare=_copy("good", "o.h5")), 2048),
    (Case("plot: file-size limit", "plot --scheme alibi --input {good} --kind all --out-dir {tmp}/figs --force",
          rf"figs/alibi_\w+\.(pdf|png): {NO_SPACE}", prepare=_copy("figs", "figs")), 2048),
    (Case("diagnose --json --force: file-size limit", "diagnose {good} --json {tmp}/d.json --force --no-figures",
          rf"d\.json: {NO_SPACE}", prepare=_copy("good", "d.json")), 100),
    (Case("diagnose figures: file-size limit", "diagnose {good} --out-dir {tmp}/figs --format pdf --force",
          rf"figs/\w+\.(pdf|json): {NO_SPACE}", prepare=_copy("figs", "figs")), 2048),
    (Case("train: file-size limit", TRAIN + " --out {tmp}/ck", rf"ck: {NO_SPACE}"), 2048),
    (Case("train --force: file-size limit", TRAIN + " --out {tmp}/ck --force", rf"ck: {NO_SPACE}",
          prepare=_copy("alibi", "ck")), 2048),
    (Case("extract into a read-only folder", EX + " --force --out {tmp}/ro/o.h5", rf"ro/o\.h5: {DENIED}",
          prepare=_read_only(_copy("good", "ro/o.h5"))), 0),
    (Case("plot into a read-only folder", "plot --scheme alibi --input {good} --out-dir {tmp}/ro/figs --force",
          rf"ro/figs/alibi_bias\.(pdf|png): {DENIED}", prepare=_read_only(_copy("figs", "ro/figs"), folder="ro/figs")),
     0),
    (Case("diagnose into a read-only folder", "diagnose {good} --json {tmp}/ro/d.json --force --no-figures",
          rf"ro/d\.json: {DENIED}", prepare=_read_only(_copy("good", "ro/d.json"))), 0),
    (Case("train into a read-only folder", TRAIN + " --out {tmp}/ro/ck --force", rf"ro/ck: {DENIED}",
          prepare=_read_only(_copy("alibi", "ro/ck"))), 0),
    (Case("extract onto /sys", EX + " --out /sys/o.h5", rf"/sys/o\.h5: {DENIED}"), 0),
    (Case("plot onto /sys", "plot --scheme alibi --input {good} --out-dir /sys/kernel/figs",
          r"/sys/kernel/figs.*(Permission denied|Operation not permitted)"), 0),
    (Case("diagnose onto /sys", "diagnose {good} --json /sys/d.json --no-figures", rf"/sys/d\.json: {DENIED}"), 0),
    (Case("train onto /sys", TRAIN + " --out /sys/kernel/ck", r"/sys/kernel/ck.*(Permission denied|not permitted)"),
     0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "limit"), WRITE_FAILURES, ids=[c.name for c, _ in WRITE_FAILURES])
def test_write_failures_name_the_users_path_and_keep_the_old_output(
    case: Case, limit: int, paths: dict[str, str], tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_case(case, paths, tmp, capsys, preexec=_file_size_limit(limit) if limit else None)
    assert ".tmp" not in err and ".partial" not in err, err


def test_figure_set_is_replaced_whole(paths: dict[str, str], tmp: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The third of four figures fails: the two written before it must not replace their old versions."""
    import errno

    from matplotlib.figure import Figure

    shutil.copytree(paths["figs"], tmp / "figs")
    before = {p.name: p.read_bytes() for p in (tmp / "figs").iterdir()}
    save, calls = Figure.savefig, []

    def third_fails(self: Figure, fname: object, *a: object, **k: object) -> None:
        calls.append(fname)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fname))
        save(self, fname, *a, **k)

    monkeypatch.setattr(Figure, "savefig", third_fails)
    code, _, err = run(["plot", "--scheme", "alibi", "--input", paths["good"], "--kind", "all", "--out-dir",
                        str(tmp / "figs"), "--force"], capsys)  # fmt: skip
    assert code == 1 and err.startswith("Error: ") and "no space left" in err, err
    assert {p.name: p.read_bytes() for p in (tmp / "figs").iterdir()} == before


# -- 6. HDF5 files that would hang a reader -------------------------------------------------------------
def _fifo_behind(tmp: Path, name: str) -> str:
    fifo = tmp / name
    os.mkfifo(fifo)
    return str(fifo)


def _external_link(tmp: Path, paths: dict[str, str]) -> None:
    shutil.copy(paths["good"], tmp / "x.h5")
    target = _fifo_behind(tmp, "pipe.h5")
    with h5py.File(tmp / "x.h5", "a") as f:
        del f["input_ids"]
        f["input_ids"] = h5py.ExternalLink(target, "/input_ids")


def _external_storage(tmp: Path, paths: dict[str, str]) -> None:
    shutil.copy(paths["good"], tmp / "x.h5")
    with h5py.File(tmp / "x.h5", "a") as f:
        bias = f["layer_1/bias"][()]
        del f["layer_1/bias"]
        f.create_dataset("layer_1/bias", data=bias, external=[(str(tmp / "raw.bin"), 0, h5py.h5f.UNLIMITED)])
    (tmp / "raw.bin").unlink()
    _fifo_behind(tmp, "raw.bin")


def _virtual(tmp: Path, paths: dict[str, str]) -> None:
    shutil.copy(paths["good"], tmp / "x.h5")
    with h5py.File(tmp / "src.h5", "w") as s, h5py.File(tmp / "x.h5", "a") as f:
        weights = f["layer_1/weights"][()]
        s["w"] = weights
        layout = h5py.VirtualLayout(shape=weights.shape, dtype=weights.dtype)
        layout[...] = h5py.VirtualSource(str(tmp / "src.h5"), "w", shape=weights.shape)
        del f["layer_1/weights"]
        f["layer_1"].create_virtual_dataset("weights", layout)
    (tmp / "src.h5").unlink()
    _fifo_behind(tmp, "src.h5")


def _link_where_nothing_reads(kind: str) -> Prepare:
    """A valid file plus one extra entry that no command reads, leading to another (existing) file."""

    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        shutil.copy(paths["good"], tmp / "x.h5")
        with h5py.File(tmp / "other.h5", "w") as o:
            o["w"] = np.zeros(4, np.float32)
        with h5py.File(tmp / "x.h5", "a") as f:
            if kind == "external link":
                f["layer_1/notes"] = h5py.ExternalLink(str(tmp / "other.h5"), "/w")
            elif kind == "group link":
                f["elsewhere"] = h5py.ExternalLink(str(tmp / "other.h5"), "/")
            else:
                layout = h5py.VirtualLayout(shape=(4,), dtype=np.float32)
                layout[...] = h5py.VirtualSource(str(tmp / "other.h5"), "w", shape=(4,))
                f.create_virtual_dataset("extra", layout)

    return prepare


HANGING_HDF5 = [
    *(Case(f"{cmd.split()[0]}: {kind} where nothing reads", cmd, r"x\.h5 .*(external|another file)",
           prepare=_link_where_nothing_reads(kind))
      for kind, cmd in (("external link", "info {tmp}/x.h5"), ("group link", "plot --scheme alibi --input {tmp}/x.h5 "
                        "--out-dir {tmp}/f"), ("virtual dataset", "diagnose {tmp}/x.h5 --out-dir {tmp}/f"))),
    Case("info: input_ids links to a FIFO", "info {tmp}/x.h5", r"x\.h5 .*(external|another file)",
         prepare=_external_link, subprocess=True),
    Case("plot: bias stored in a FIFO", "plot --scheme alibi --input {tmp}/x.h5 --out-dir {tmp}/f",
         r"x\.h5 .*(external|another file)", prepare=_external_storage, subprocess=True),
    Case("diagnose: weights mapped from a FIFO", "diagnose {tmp}/x.h5 --out-dir {tmp}/f",
         r"x\.h5 .*(external|another file)", prepare=_virtual, subprocess=True),
    Case("info: a FIFO named .h5", "info {tmp}/x.h5", r"x\.h5 is not a regular file",
         prepare=lambda tmp, _p: _fifo_behind(tmp, "x.h5"), subprocess=True),
    Case("info: HDF5 validation past its time limit", "info {good}", r"good\.h5 took longer than",
         subprocess=True),
]  # fmt: skip


@pytest.mark.parametrize("case", HANGING_HDF5, ids=str)
def test_hdf5_from_elsewhere_cannot_hang(
    case: Case, paths: dict[str, str], tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if "time limit" in case.name:
        monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", "0.001")
    run_case(case, paths, tmp, capsys)


# -- 7. provenance ----------------------------------------------------------------------------------------
def _beside(layout: str) -> Prepare:
    """A state dict with a tokenizer.json beside it: a .pt file, nanoGPT's out_dir, a .safetensors file."""

    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        import torch

        (tmp / "run").mkdir()
        shutil.copy(Path(paths["alibi"]) / "tokenizer.json", tmp / "run" / "tokenizer.json")
        state = torch.load(paths["sd"], weights_only=True)
        if layout == "safetensors":
            from safetensors.torch import save_file

            save_file(state, str(tmp / "run" / "model.safetensors"))
        else:
            torch.save(state, tmp / "run" / ("ckpt.pt" if layout == "out_dir" else "model.pt"))

    return prepare


TOKENIZER_BESIDE = [
    Case("tokenizer beside a .pt", EX.replace("{alibi}", "{tmp}/run/model.pt") + " --scheme alibi --out {tmp}/o.h5",
         "", code=0, prepare=_beside("pt")),
    Case("tokenizer in nanoGPT's out_dir", EX.replace("{alibi}", "{tmp}/run") + " --scheme alibi --out {tmp}/o.h5",
         "", code=0, prepare=_beside("out_dir")),
    Case("tokenizer beside a .safetensors", EX.replace("{alibi}", "{tmp}/run/model.safetensors")
         + " --scheme alibi --out {tmp}/o.h5", "", code=0, prepare=_beside("safetensors")),
]  # fmt: skip


@pytest.mark.parametrize("case", TOKENIZER_BESIDE, ids=str)
def test_tokenizer_is_recorded_under_its_own_path(case: Case, paths: dict[str, str], tmp: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from tests.hostile import argv_of

    assert case.prepare is not None
    case.prepare(tmp, paths)
    code, _, err = run(argv_of(case, paths, tmp), capsys)
    assert code == 0, err
    with h5py.File(tmp / "o.h5", "r") as f:
        recorded = f.attrs["tokenizer"]
        recorded = recorded.decode() if isinstance(recorded, bytes) else str(recorded)
    assert recorded.split(" (")[0] == str((tmp / "run" / "tokenizer.json").resolve()), recorded


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_checkpoint_files_share_one_mode(umask: int, paths: dict[str, str], tmp: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from tests.hostile import argv_of

    old = os.umask(umask)
    try:
        code, _, err = run(argv_of(Case("t", TRAIN + " --out {tmp}/ck", ""), paths, tmp), capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp / "ck").iterdir()}
    assert set(modes.values()) == {0o666 & ~umask}, modes
    assert stat.S_IMODE((tmp / "ck").stat().st_mode) == 0o777 & ~umask


def test_table_sizes() -> None:
    """The tables quoted in the change notes."""
    from tests.project import test_hostile as t

    tables = [t.NEVER_REPLACED, t.OPTIONS, t.FOREIGN, t.NOT_APPLICABLE, WRITE_FAILURES, HANGING_HDF5, TOKENIZER_BESIDE]
    assert sum(map(len, tables)) >= 100
    names = [c.name for table in tables for c in (x[0] if isinstance(x, tuple) else x for x in table)]
    assert len(set(names)) == len(names)

