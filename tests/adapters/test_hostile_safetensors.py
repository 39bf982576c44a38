"""A safetensors header that does not add up is one ``Error:`` line naming the file: a shape whose size overflows,
a reversed byte range, tensors that overlap, a dtype that does not fit its bytes (F64 over float32 data)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile import EXTRACT, Case, argv_of, check, checkpoint, run, run_case


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return checkpoint(tmp_path_factory.mktemp("st"))


Header = dict[str, dict[str, object]]


def _lying(change: Callable[[Header], None]) -> Callable[[Path, dict[str, str]], None]:
    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        shutil.copytree(paths["ck"], tmp / "ck")
        raw = (tmp / "ck" / "model.safetensors").read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        change(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        (tmp / "ck" / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])

    return prepare


def _tensors(header: Header) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])  # type: ignore[index]


def _overflow(header: Header) -> None:
    header[_tensors(header)[0]]["shape"] = [2**62, 2**62, 2**62]


def _reversed(header: Header) -> None:
    first = header[_tensors(header)[0]]
    first["data_offsets"] = first["data_offsets"][::-1]  # type: ignore[index]


def _overlap(header: Header) -> None:
    """Two tensors of the same size, the second moved onto the first's bytes."""
    size = {k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0] for k in _tensors(header)}  # type: ignore[index]
    a, b = next((a, b) for a in size for b in size if a < b and size[a] == size[b])
    header[b]["data_offsets"] = list(header[a]["data_offsets"])  # type: ignore[arg-type]


def _f64(header: Header) -> None:
    name = next(k for k in _tensors(header) if header[k]["dtype"] == "F32")
    header[name]["dtype"] = "F64"


CASES = [
    Case("a shape whose size overflows", EXTRACT, r"model\.safetensors is not a valid safetensors file: .*declares F32",
         prepare=_lying(_overflow)),
    Case("reversed data offsets", EXTRACT, r"model\.safetensors is not a valid safetensors file: .*reversed",
         prepare=_lying(_reversed)),
    Case("overlapping tensors", EXTRACT, r"model\.safetensors is not a valid safetensors file: tensors .* overlap",
         prepare=_lying(_overlap)),
    Case("F64 over float32 bytes", EXTRACT, r"model\.safetensors is not a valid safetensors file: .*declares F64",
         prepare=_lying(_f64)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_lying_header_is_one_error_line(case: Case, paths: dict[str, str], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: a traceback from the safetensors library (SafetensorError) when the checkpoint loaded."""
    run_case(case, paths, tmp_path, capsys)


def test_a_sparse_weights_file_is_refused_before_it_is_mapped(paths: dict[str, str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A weights file grown to 128 GiB of holes past its tensors: old code mapped it and ended in a MemoryError
    traceback (under the case's memory limit). Not a run_case: hashing the user's files would read 128 GiB."""
    shutil.copytree(paths["ck"], tmp_path / "ck")
    with (tmp_path / "ck" / "model.safetensors").open("r+b") as f:
        f.truncate(128 << 30)
    case = Case("128 GiB of holes", EXTRACT, r"model\.safetensors is not a valid safetensors file: it holds "
                r"[\d,]+ bytes past its last tensor", subprocess=True)  # fmt: skip
    code, _out, err = run(argv_of(case, paths, tmp_path), capsys, in_subprocess=True, cwd=tmp_path)
    check(case, code, err)
    assert not (tmp_path / "o.h5").exists()
