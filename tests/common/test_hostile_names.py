"""Names at the file system's limits: an output name the file system accepts works (temporary and lock names
included), one it refuses is one ``Error:`` line, and nothing is left behind either way.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import pytest

from tests.conftest import run_cli
from tests.hostile import make_assets

NAME_MAX = os.pathconf("/tmp", "PC_NAME_MAX")  # 255 on Linux file systems
ASCII = "n" * (NAME_MAX - 3)  # + ".h5": exactly NAME_MAX bytes
UTF8 = "é" * ((NAME_MAX - 3) // 2)  # two bytes a character: at most NAME_MAX bytes with ".h5"
ODD = "-a b\tc\nd.h5"  # stands for ODD in a command line (it would not survive splitting)
EX = "extract --model {alibi} --text {text} --seq-len 8 --samples 1 --quiet"
TRAIN = "train --scheme alibi --steps 1 --seq-len 8 --batch-size 1 --corpus {text} --device cpu --quiet"

#: (name, argv with {d} the case's folder, the output that must exist afterwards, or None for an error)
NAMES = [
    ("extract, longest ASCII name", EX + " --out {d}/" + ASCII + ".h5", ASCII + ".h5"),
    ("extract, longest UTF-8 name", EX + " --out {d}/" + UTF8 + ".h5", UTF8 + ".h5"),
    ("extract --summary, longest name", EX + " --summary --out {d}/" + ASCII + ".h5", ASCII + ".h5"),
    ("explore, longest name", "explore {good} --out {d}/" + "p" * (NAME_MAX - 5) + ".html",
     "p" * (NAME_MAX - 5) + ".html"),
    ("diagnose --json, longest name", "diagnose {good} --no-figures --json {d}/" + "j" * (NAME_MAX - 5) + ".json",
     "j" * (NAME_MAX - 5) + ".json"),
    ("train, longest folder name", TRAIN + " --out {d}/" + "c" * NAME_MAX, "c" * NAME_MAX),
    ("plot, longest folder name", "plot --scheme alibi --input {good} --format png --out-dir {d}/" + "f" * NAME_MAX,
     "f" * NAME_MAX + "/alibi_bias.png"),
    ("extract, spaces, newline and a leading dash", EX + " --out={d}/ODD", ODD),
    ("extract, one byte too long", EX + " --out {d}/" + "n" * (NAME_MAX - 2) + ".h5", None),
    ("train, one byte too long", TRAIN + " --out {d}/" + "c" * (NAME_MAX + 1), None),
    ("explore, one byte too long", "explore {good} --out {d}/" + "p" * (NAME_MAX - 4) + ".html", None),
    ("extract, a path past PATH_MAX", EX + " --out {d}/" + "/".join(["x" * 200] * 25) + "/o.h5", None),
]  # fmt: skip


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_assets(tmp_path_factory.mktemp("names"))


@pytest.mark.parametrize(("name", "argv", "made"), NAMES, ids=[c[0].replace("\n", " ") for c in NAMES])
def test_names_at_the_limits(assets: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch, name: str, argv: str, made: str | None) -> None:
    import shlex

    monkeypatch.chdir(tmp_path)
    d = tmp_path / "out"
    d.mkdir()
    split = shlex.split(argv.replace("{d}", "DIR").format(**assets))
    parts = [p.replace("DIR", str(d)).replace("ODD", ODD) for p in split]
    code, _, err = run_cli(parts, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    if made is None:
        assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (code, err)
        assert "too long" in lines[0], lines[0]
        assert list(d.iterdir()) == []
        return
    assert code == 0, err
    assert (d / made).exists()
    if made.endswith(".h5"):
        with h5py.File(d / made) as f:
            assert "biasviz_format" in f.attrs
    leftovers = [p.name for p in d.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # temporary and lock files gone


def test_table_size() -> None:
    assert len(NAMES) >= 8
