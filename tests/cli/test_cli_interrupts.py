"""Nothing is lost: interrupted, out-of-space and concurrent runs leave whole files or none.

The commands run as real subprocesses (the installed ``biasviz`` script), are signalled while their
temporary file exists, and the folder is inspected afterwards: the target must be absent or
byte-identical to what was there before, and no temporary file may remain.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from biasviz.cli import main
from biasviz.data import build_tokenizer, save_tokenizer
from biasviz.store import open_bias_file
from tests.conftest import small_model

BIASVIZ = Path(sys.executable).with_name("biasviz")
TEXT = "\n".join(f"for k{i} in range({i}):\n    total += k{i} ** 2  # step {i}" for i in range(500))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("intr")
    small_model("alibi", vocab_size=300).save_pretrained(root / "alibi")
    save_tokenizer(build_tokenizer([TEXT], 300), root / "alibi")
    (root / "text.txt").write_text(TEXT)
    # made in-process (no interpreter start-up): a small data file, and what each seed alone writes
    main(_extract_argv(root, root / "a.h5", samples=2)[1:])
    for seed in (1, 2):
        main(_extract_argv(root, root / f"ref{seed}.h5", "--seed", str(seed), samples=16)[1:])
    return root


def _extract_argv(ckpt: Path, out: Path, *extra: str, samples: int = 48) -> list[str]:
    return [str(BIASVIZ), "extract", "--model", str(ckpt / "alibi"), "--text", str(ckpt / "text.txt"),
            "--seq-len", "64", "--samples", str(samples), "--layer", "all", "--quiet",
            "--out", str(out), *extra]  # fmt: skip


def _temps(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp"))


def _wait_for_temp(proc: subprocess.Popen[str], folder: Path, timeout: float = 60) -> bool:
    """Poll until a temporary file appears (True) or the process ends first (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _temps(folder):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    raise AssertionError("no temporary file appeared")


@pytest.mark.parametrize(
    ("sig", "delay", "existing"),
    [(signal.SIGINT, 0.0, False), (signal.SIGTERM, 0.05, True), (signal.SIGINT, 0.3, True)],
    ids=["sigint-at-once", "sigterm-midway-over-old", "sigint-late-over-old"],
)
def test_interrupted_extract_leaves_target_absent_or_untouched(ckpt: Path, tmp_path: Path, sig: int, delay: float,
                                                               existing: bool) -> None:  # fmt: skip
    target = tmp_path / "run.h5"
    if existing:
        target.write_bytes(b"results from last week")
    argv = _extract_argv(ckpt, target, *(["--force"] if existing else []))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    caught = _wait_for_temp(proc, tmp_path)
    time.sleep(delay)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert not _temps(tmp_path), "a temporary file was left behind"
    if proc.returncode == 0:  # it finished before the signal: then the file is complete
        with open_bias_file(target) as f:
            assert f.n_samples == 48
        return
    assert caught and proc.returncode == 130 and err.strip().splitlines()[-1].startswith("Error: interrupted")
    if existing:
        assert target.read_bytes() == b"results from last week"
    else:
        assert not target.exists()


def test_interrupted_plot_keeps_previous_figures(ckpt: Path, tmp_path: Path) -> None:
    data = ckpt / "a.h5"
    figs = tmp_path / "figs"
    plot = [str(BIASVIZ), "plot", "--scheme", "alibi", "--input", str(data), "--out-dir", str(figs),
            "--kind", "all", "--format", "pdf,png"]  # fmt: skip
    main([*plot[1:], "--normalize", "none"])
    before = {p.name: p.read_bytes() for p in figs.iterdir()}
    assert sorted(before) == ["alibi_bias.pdf", "alibi_bias.png", "alibi_weights.pdf", "alibi_weights.png"]
    for sig in (signal.SIGTERM,):  # SIGINT takes the same path (see the extract tests)
        proc = subprocess.Popen([*plot, "--dpi", "150"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for_temp(proc, figs)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err
        assert not _temps(figs)
        for name, old in before.items():  # each figure is the old one or a complete new one
            new = (figs / name).read_bytes()
            assert new == old or (new.rstrip().endswith(b"%%EOF") if name.endswith(".pdf") else b"IEND" in new[-12:])


def _limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_full_disk_extract_is_a_clear_error_and_leaves_no_partial_file(ckpt: Path, tmp_path: Path) -> None:
    target = tmp_path / "big.h5"
    proc = subprocess.run(_extract_argv(ckpt, target), capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: _limit_file_size(60_000))  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot write") and "big.h5" in lines[0], lines
    assert "no space left" in lines[0] and "file size" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_full_disk_plot_keeps_previous_figure(ckpt: Path, tmp_path: Path) -> None:
    plot = [str(BIASVIZ), "plot", "--scheme", "alibi", "--input", str(ckpt / "a.h5"), "--out-dir", str(tmp_path),
            "--format", "png"]  # fmt: skip
    main(plot[1:])
    before = (tmp_path / "alibi_bias.png").read_bytes()
    proc = subprocess.run([*plot, "--dpi", "300", "--force"], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: _limit_file_size(len(before) // 2))  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "alibi_bias.png: no space left" in lines[0], lines
    assert (tmp_path / "alibi_bias.png").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alibi_bias.png"]


@pytest.mark.parametrize("force", [False, True], ids=["no-force", "force"])
def test_two_runs_to_one_target_never_mix(ckpt: Path, tmp_path: Path, force: bool) -> None:
    target = tmp_path / "shared.h5"
    refs = {}
    for seed in (1, 2):  # what each run alone writes
        with open_bias_file(ckpt / f"ref{seed}.h5") as f:
            refs[seed] = (f.input_ids(), f.read("weights", 0))
    extra = ["--force"] if force else []
    procs = [subprocess.Popen(_extract_argv(ckpt, target, "--seed", str(s), *extra, samples=16),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for s in (1, 2)]  # fmt: skip
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 1]), results  # the second fails when it finds the first writing (or done)
    for code, err in results:
        assert "Traceback" not in err
        if code:
            assert any(why in err for why in ("already exists", "appeared while extracting",
                                              "another biasviz process is writing")), err  # fmt: skip
    with open_bias_file(target) as f:
        seed = int(f.attrs["seed"])
        ids, weights = f.input_ids(), f.read("weights", 0)
    assert seed in refs
    assert (ids == refs[seed][0]).all() and (weights == refs[seed][1]).all()  # one run's data, entirely
    assert not _temps(tmp_path)


def test_an_interrupt_inside_a_finaliser_is_raised_at_the_next_step_not_printed(capsys) -> None:
    import types

    from biasviz.cli import _interrupts_reach_main
    from biasviz.common.errors import check_interrupted

    _interrupts_reach_main(types.SimpleNamespace(exc_value=KeyboardInterrupt(), exc_type=KeyboardInterrupt))
    assert capsys.readouterr().err == ""
    with pytest.raises(KeyboardInterrupt):
        check_interrupted()
    check_interrupted()  # raised once only


def test_an_interrupt_a_library_turns_into_its_own_error_is_still_an_interrupt(monkeypatch, capsys) -> None:  # noqa: ANN001
    """h5py, interrupted inside a type conversion, raises a TypeError with the KeyboardInterrupt as its context:
    one Error line and exit code 130, as for any Ctrl-C, never a traceback."""
    import biasviz.cli as cli_module

    def interrupted(*args: object, **kwargs: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise TypeError("Operation not defined for data type class") from None

    monkeypatch.setattr(cli_module.cli, "main", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        cli_module.main(["info", "x.h5"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 130 and err == "Error: interrupted; no partial output was left behind.\n", err
