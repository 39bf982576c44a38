"""Child processes run none of the user's code: not a module in the folder a command runs in, not one the
user's PYTHON* variables point at. biasviz opens files from elsewhere in a child (``store/guard.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError
from tests.hostile import limited, run
from tests.project.test_untrusted import write_valid

SRC = Path(__file__).resolve().parents[2] / "src" / "biasviz"


def plant(folder: Path, marker: Path) -> Path:
    """Modules a child might import from ``folder``: each writes ``marker`` when it runs."""
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("h5py.py", "numpy.py", "click.py"):
        (folder / name).write_text(payload)
    (folder / "biasviz").mkdir(exist_ok=True)
    (folder / "biasviz" / "__init__.py").write_text(payload)
    return folder


@pytest.mark.parametrize("command", [["info"], ["diagnose"]])
def test_modules_in_the_working_folder_never_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 command: list[str]) -> None:  # fmt: skip
    """Old code: the child ``python -m biasviz.store.reader`` imported ``./biasviz`` and ``./h5py.py``."""
    good = write_valid(tmp_path / "good.h5")
    marker = tmp_path / "ran"
    work = plant(tmp_path / "work", marker)
    code, out, err = run([*command, str(good)], capsys, in_subprocess=True, cwd=work)
    assert not marker.exists(), f"code from the working folder ran: {marker.read_text()}"
    assert code == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize("variable", ["PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"])
def test_the_users_import_variables_do_not_reach_the_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           variable: str) -> None:  # fmt: skip
    """Old code: the child honoured PYTHONPATH (ran the planted modules) and PYTHONHOME (failed to start). The
    child still imports this process's biasviz (here from a PYTHONPATH the parent was given, now removed)."""
    from biasviz.store.guard import check_isolated

    good = write_valid(tmp_path / "good.h5")
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5")
    marker = tmp_path / "ran"
    payload = plant(tmp_path / "payload", marker)
    (payload / "startup.py").write_text(f"open({str(marker)!r}, 'a').write('startup\\n')\n")
    value = {"PYTHONSTARTUP": str(payload / "startup.py"), "PYTHONHOME": str(tmp_path / "nowhere")}.get(variable,
                                                                                                       str(payload))
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", "30")
    with limited():
        check_isolated(good)
        with pytest.raises(BiasvizError, match="not a readable HDF5 file"):  # the child's own words: biasviz ran
            check_isolated(bad)
    assert not marker.exists(), f"the user's code ran in the child: {marker.read_text()}"


def test_every_child_process_starts_in_one_place() -> None:
    """One function starts biasviz's children (:func:`biasviz.common.children.run_module`); no other module calls
    subprocess, multiprocessing or ``sys.executable`` itself. Old code: ``store/guard.py`` did."""
    starts = re.compile(r"\bsubprocess\.(?:run|Popen|call|check_call|check_output|getoutput)\b|\bmultiprocessing\b"
                        r"|\bsys\.executable\b|\bos\.(?:system|popen|exec\w*|spawn\w*|fork\w*|posix_spawn\w*)\(")
    found = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p.name != "children.py"
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if starts.search(line.split("#")[0])]  # fmt: skip
    assert found == []
