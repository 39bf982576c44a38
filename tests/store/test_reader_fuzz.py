"""Fuzz ``biasviz info``: random, truncated, mutated and bit-flipped files never end in a traceback.

Each case must exit 0 (the file is still valid) or 1 with exactly one ``Error:`` line. The loop is
seeded, so a failure names a case that can be replayed. Each case's bytes are opened once in ``info``'s isolated
child: its JSON run takes the verdict of its text run's child (the same bytes), and renders its own output.
"""

from __future__ import annotations

import hashlib
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import run_cli
from tests.project.test_untrusted import write_valid

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
CASES = 40  # random cases, each read as text and as JSON
REQUIRED = ["biasviz_format", "scheme", "context_dependent", "n_layers", "n_heads", "seq_len", "layers", "samples",
            "source_model", "dtype", "created_utc"]  # fmt: skip
WRONG_VALUES: list[object] = [
    "text", b"\x80\x04\x95bytes", 1.5, -3, 2**62, np.array([], dtype=np.int64), np.array([[1, 2], [3, 4]]),
    np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), np.void(b"\x00\x01opaque"), np.array([1.0, np.nan]),
    True, np.array(["a", "b"], dtype=h5py.string_dtype()),
]  # fmt: skip


def _run_info(path: Path, capsys: pytest.CaptureFixture[str], as_json: bool) -> tuple[int, str]:
    code, _, err = run_cli(["info", *(["--json"] if as_json else []), str(path)], capsys)
    return code, err


def _mutate_attrs(rng: random.Random, path: Path) -> str:
    with h5py.File(path, "a") as f:
        what = rng.choice(["delete", "wrong", "format", "layers", "structure"])
        if what == "delete":
            key = rng.choice(REQUIRED)
            del f.attrs[key]
            return f"delete {key}"
        if what == "wrong":
            key, value = rng.choice(REQUIRED), rng.choice(WRONG_VALUES)
            f.attrs[key] = value
            return f"{key} = {value!r}"
        if what == "format":
            value = rng.choice([2, 0, "1", 1.0, np.array([1, 1]), -1])
            f.attrs["biasviz_format"] = value
            return f"biasviz_format = {value!r}"
        if what == "layers":
            value = rng.choice([[7], [0, 1], [1, 1], [-1], [], [[1]], [b"1"], [1.0]])
            f.attrs["layers"] = np.asarray(value)
            return f"layers = {value!r}"
        change = rng.choice(["no input_ids", "weights as group", "int weights", "short ids", "heads", "seq_len"])
        if change == "no input_ids":
            del f["input_ids"]
        elif change == "weights as group":
            del f["layer_1/weights"]
            f.create_group("layer_1/weights")
        elif change == "int weights":
            del f["layer_1/weights"]
            f["layer_1/weights"] = np.zeros((2, 3, 8, 8), np.int8)
        elif change == "short ids":
            del f["input_ids"]
            f["input_ids"] = np.zeros((2, 5), np.int32)
        elif change == "heads":
            f.attrs["n_heads"] = 4
        else:
            f.attrs["seq_len"] = 9
        return change


def _case(rng: random.Random, valid: Path, target: Path) -> str:
    kind = rng.choice(["random", "signature", "truncated", "attrs", "attrs", "flips"])
    data = valid.read_bytes()
    if kind == "random":
        target.write_bytes(rng.randbytes(rng.randrange(0, 4096)))
    elif kind == "signature":
        target.write_bytes(HDF5_SIGNATURE + rng.randbytes(rng.randrange(0, 4096)))
    elif kind == "truncated":
        target.write_bytes(data[: rng.randrange(0, len(data))])
    elif kind == "attrs":
        shutil.copy(valid, target)
        return "attrs: " + _mutate_attrs(rng, target)
    else:
        buf = bytearray(data)
        for _ in range(rng.randrange(1, 20)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(buf))
    return kind


@pytest.fixture
def one_child_per_content(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """``info``'s isolated check, run in its child once per file content; a second look at the same bytes gets
    the first verdict again (a new error with the same message). Returns the count of children started."""
    import biasviz.store.reader as reader

    real = reader.check_isolated
    verdicts: dict[bytes, BaseException | None] = {}
    started = {"children": 0}

    def check(path: Path) -> None:
        key = hashlib.sha256(Path(path).read_bytes()).digest() + str(path).encode()
        if key not in verdicts:
            started["children"] += 1
            try:
                real(path)
                verdicts[key] = None
            except Exception as exc:  # noqa: BLE001 (the child's verdict, whatever it was, is given again)
                verdicts[key] = exc
        verdict = verdicts[key]
        if verdict is not None:
            raise type(verdict)(*verdict.args)

    monkeypatch.setattr(reader, "check_isolated", check)
    return started


def test_fuzz_info_never_ends_in_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_child_per_content: dict[str, int]
) -> None:
    valid = write_valid(tmp_path / "valid.h5", n=2, heads=3, t=8, layers=(1,))
    code, err = _run_info(valid, capsys, as_json=False)
    assert code == 0, err
    rng = random.Random(20240601)
    outcomes: dict[int, int] = {0: 0, 1: 0}
    for i in range(CASES):
        target = tmp_path / f"case{i}.h5"
        desc = _case(rng, valid, target)
        for as_json in (False, True):
            code, err = _run_info(target, capsys, as_json)
            lines = [line for line in err.splitlines() if line.strip()]
            assert code in (0, 1), (i, desc, code, err)
            if code == 1:
                assert len(lines) == 1 and lines[0].startswith("Error: "), (i, desc, err)
            assert "Traceback" not in err, (i, desc, err)
            outcomes[code] += 1
        target.unlink()
    assert outcomes[1] > CASES  # most of the 2 x CASES runs met broken files, reported as such
    assert one_child_per_content["children"] == CASES + 1  # every case's bytes met the isolated child


MUTATIONS: list[tuple[str, Callable[[h5py.File], None], str]] = [
    ("format 2", lambda f: f.attrs.__setitem__("biasviz_format", 2), r"biasviz format 2; .*\(upgrade biasviz\)"),
    ("layers point at a missing group", lambda f: f.attrs.__setitem__("layers", np.array([0])),
     r"lists layer 0 but has no layer_0/weights"),
    ("layers beyond n_layers", lambda f: f.attrs.__setitem__("layers", np.array([5])), r"not a set of indices in 0..1"),
    ("n_heads as text", lambda f: f.attrs.__setitem__("n_heads", "twelve"), r"'n_heads' should be an integer"),
    ("seq_len disagrees", lambda f: f.attrs.__setitem__("seq_len", 9), r"input_ids' with 9 queries"),
    ("weights of ints", lambda f: (f.__delitem__("layer_1/weights"),
                                   f.__setitem__("layer_1/weights", np.zeros((2, 3, 8, 8), np.int8))),
     r"layer_1/weights is int8 .*expected float \(2, 3, 8, 8\)"),
    ("no input_ids", lambda f: f.__delitem__("input_ids"), r"no \(sample, query\) dataset 'input_ids'"),
    ("missing attribute", lambda f: f.attrs.__delitem__("seq_len"), r"lacks required attributes: seq_len"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "pattern"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS])
def test_each_structural_fault_has_its_own_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Callable[[h5py.File], None], pattern: str
) -> None:
    import re

    f = write_valid(tmp_path / "m.h5")
    with h5py.File(f, "a") as h:
        mutate(h)
    code, err = _run_info(f, capsys, as_json=False)
    assert code == 1 and re.search(pattern, err), err
