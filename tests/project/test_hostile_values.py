"""Values read from files and from the environment are untrusted (two table-driven classes of hostile input).

Attributes: each case damages one root attribute of a valid file (wrong type, shape, emptiness, NaN or
infinity, absurd size). Every command that reads the file either works or says one ``Error:`` line (naming
the attribute where it is one the reader needs); no traceback, nothing written, and ``info --json`` always
prints strict JSON (no NaN or Infinity tokens, which JSON does not have).

Numbers from options and the environment: ``inf``, ``nan`` and absurd values are one ``Error:`` line.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import run_cli
from tests.hostile import snapshot
from tests.project.test_untrusted import write_valid

NAN, INF = np.float64("nan"), np.float64("inf")
VLEN = h5py.string_dtype()

#: (name, attribute, value, whether the readers need it: an error must then name it)
ATTRIBUTES: list[tuple[str, str, object, bool]] = [
    ("scheme NaN", "scheme", NAN, True),
    ("scheme empty", "scheme", "", False),
    ("scheme list", "scheme", np.array(["alibi", "t5"], dtype=object), True),
    ("context_dependent text", "context_dependent", "yes", True),
    ("context_dependent_known empty", "context_dependent_known", np.array([], dtype=bool), True),
    ("context_dependent_known text", "context_dependent_known", "maybe", True),
    ("n_heads NaN", "n_heads", NAN, True),
    ("n_heads absurd", "n_heads", np.int64(2**62), True),
    ("seq_len negative", "seq_len", np.int64(-5), True),
    ("seq_len infinite", "seq_len", INF, True),
    ("layers empty", "layers", np.array([], np.int64), True),
    ("layers 2-D", "layers", np.array([[1]], np.int64), True),
    ("layers NaN", "layers", np.array([NAN]), True),
    ("causal pair", "causal", np.array([1, 0], np.int8), True),
    ("bias_only text", "bias_only", "true", True),
    ("summary NaN", "summary", NAN, True),
    ("bias_convention infinite", "bias_convention", INF, False),
    ("tokenizer number array", "tokenizer", np.array([1.5, NAN]), False),
    ("seed infinite", "seed", INF, False),
    ("model_sha256 NaN", "model_sha256", NAN, False),
    ("config_json with NaN", "config_json", '{"dropout": NaN, "rope_theta": Infinity}', False),
    ("float array with NaN", "extra", np.array([NAN, INF, -INF, 1.0]), False),
    ("scheme a broken formula", "scheme", "$\\frac{$", False),
    ("scheme an unknown symbol", "scheme", "_{}^$\\undefined$", False),
    ("scheme half a formula", "scheme", "50% $x^$", False),
]


def strict_json(text: str) -> object:
    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def commands(f: Path, out: Path) -> dict[str, list[str]]:
    return {
        "info": ["info", str(f)],
        "info --json": ["info", "--json", str(f)],
        "plot": ["plot", "--scheme", "alibi", "--input", str(f), "--out-dir", str(out / "plot"), "--format", "png"],
        "diagnose": ["diagnose", str(f), "--json", str(out / "d.json"), "--out-dir", str(out / "diag"),
                     "--format", "png"],  # fmt: skip
        "explore": ["explore", str(f), "--out", str(out / "page.html")],
    }


@pytest.mark.parametrize(("name", "key", "value", "needed"), ATTRIBUTES, ids=[c[0] for c in ATTRIBUTES])
def test_a_damaged_attribute_is_data_or_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str,
                                                 key: str, value: object, needed: bool) -> None:  # fmt: skip
    f = write_valid(tmp_path / "in" / "x.h5", t=8)
    with h5py.File(f, "a") as h:
        if key in h.attrs:
            del h.attrs[key]
        if isinstance(value, np.ndarray) and value.dtype == object:
            h.attrs.create(key, value, dtype=VLEN)
        else:
            h.attrs[key] = value
    for what in commands(f, tmp_path):
        out = tmp_path / what.replace(" ", "_")
        argv = commands(f, out)[what]
        before = snapshot(f.parent)
        code, stdout, err = run_cli(argv, capsys)
        assert "Traceback" not in err, (what, err)
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("Warning: ")]
        if code != 0:
            assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (what, code, err)
            if needed:
                assert f"'{key}'" in lines[0] or key in lines[0], (what, lines[0])
            assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), (what, list(out.rglob("*")))
        elif what == "info --json":
            strict_json(stdout)
        assert snapshot(f.parent) == before, f"{what} changed the input"


def test_table_sizes() -> None:
    assert len(ATTRIBUTES) >= 8


# -- numbers from options and the environment -------------------------------------------------------------------

#: (name, argv after `biasviz` with {good}, {alibi}, {text}, {out} filled in, environment additions)
NUMBERS: list[tuple[str, str, dict[str, str]]] = [
    ("explore --max-mb nan", "explore {good} --max-mb nan --out {out}/p.html", {}),
    ("explore --max-mb inf", "explore {good} --max-mb inf --out {out}/p.html", {}),
    ("train --lr nan", "train --scheme alibi --text {text} --out {out}/run --steps 1 --lr nan", {}),
    ("train --lr inf", "train --scheme alibi --text {text} --out {out}/run --steps 1 --lr inf", {}),
    ("train --lr absurd", "train --scheme alibi --text {text} --out {out}/run --steps 1 --lr 1e300", {}),
    ("train --steps absurd", "train --scheme alibi --text {text} --out {out}/run --steps 1e3", {}),
    ("train --seed inf", "train --scheme alibi --text {text} --out {out}/run --steps 1 --seed inf", {}),
    ("extract --seq-len absurd", "extract --model {alibi} --text {text} --seq-len 1000000000000000 --out {out}/x.h5",
     {}),
    ("extract --samples absurd", "extract --model {alibi} --text {text} --samples 1000000000000000 --seq-len 16 "
     "--out {out}/x.h5", {}),
    ("extract --resolution absurd", "extract --model {alibi} --text {text} --samples 1 --seq-len 16 --summary "
     "--resolution 100000000000000000000 --out {out}/x.h5", {}),
    ("extract --batch-size nan", "extract --model {alibi} --text {text} --batch-size nan --out {out}/x.h5", {}),
    ("plot --step absurd", "plot --scheme alibi --input {good} --step 100000000000000000000000 --out-dir {out}/f", {}),
    ("plot --layer absurd", "plot --scheme alibi --input {good} --layer -100000000000000000000 --out-dir {out}/f", {}),
    ("plot --dpi inf", "plot --scheme alibi --input {good} --dpi inf --out-dir {out}/f", {}),
    ("HDF5 timeout nan", "info {good}", {"BIASVIZ_HDF5_TIMEOUT": "nan"}),
    ("HDF5 timeout inf", "info {good}", {"BIASVIZ_HDF5_TIMEOUT": "inf"}),
    ("HDF5 timeout negative", "info {good}", {"BIASVIZ_HDF5_TIMEOUT": "-5"}),
    ("HDF5 timeout absurd", "info {good}", {"BIASVIZ_HDF5_TIMEOUT": "1e400"}),
    ("HDF5 timeout text", "info {good}", {"BIASVIZ_HDF5_TIMEOUT": "soon"}),
    ("WORLD_SIZE inf", "extract --model {alibi} --text {text} --samples 1 --seq-len 16 --out {out}/x.h5",
     {"WORLD_SIZE": "inf"}),
    ("RANK beyond WORLD_SIZE", "extract --model {alibi} --text {text} --samples 1 --seq-len 16 --out {out}/x.h5",
     {"WORLD_SIZE": "2", "RANK": "7"}),
    ("LOCAL_RANK negative", "extract --model {alibi} --text {text} --samples 1 --seq-len 16 --out {out}/x.h5",
     {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-3"}),
]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from tests.hostile import make_assets

    return make_assets(tmp_path_factory.mktemp("numbers"))


@pytest.mark.parametrize(("name", "argv", "env"), NUMBERS, ids=[c[0] for c in NUMBERS])
def test_a_hostile_number_is_one_error(assets: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch, name: str, argv: str,
                                       env: dict[str, str]) -> None:  # fmt: skip
    import shlex

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    before = snapshot(Path(assets["root"]))
    code, _, err = run_cli(shlex.split(argv.format(**assets, out=out)), capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("Error: "), (name, code, err)
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*")), list(out.rglob("*"))
    assert snapshot(Path(assets["root"])) == before


def test_number_table_size() -> None:
    assert len(NUMBERS) >= 8
