"""Checked reading of attributes and links (:mod:`biasviz.store.validation`): typed attributes, one error naming a
wrong one, links and storage that lead to other files refused, and values turned into plain, printable data."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from biasviz.common.errors import BiasvizError
from biasviz.store.validation import AttrChecks, describe, plain, shape_text, short_text, text


def checks(f: h5py.File, path: Path) -> AttrChecks:
    """The checks of an open file, as the reader holds them."""
    c = AttrChecks()
    c.path, c._h5 = path, f
    return c


@pytest.fixture
def attrs_file(tmp_path: Path) -> Path:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update({"n": np.int64(5), "one": np.array([7], np.int32), "yes": True, "zero": 0, "half": 2.5,
                        "name": "alibi", "raw": np.bytes_(b"kerple"), "pair": np.array([1, 2]),
                        "names": np.array(["t5"], dtype=h5py.string_dtype())})  # fmt: skip
    return path


def test_integers_text_and_flags_are_read_with_their_types(attrs_file: Path) -> None:
    with h5py.File(attrs_file) as f:
        c = checks(f, attrs_file)
        assert c._int_attr("n") == 5 and type(c._int_attr("n")) is int
        assert c._int_attr("one") == 7  # an array of one value
        assert c._int_attr("yes") == 1  # HDF5 keeps booleans as integers
        assert c._str_attr("name") == "alibi"
        assert c._str_attr("raw") == "kerple"  # bytes decoded
        assert c._str_attr("names") == "t5"  # an array of one string
        assert c._bool_attr("yes") is True and c._bool_attr("zero") is False
        assert c._flag("yes") is True and c._flag("absent") is False


@pytest.mark.parametrize(("read", "key", "words"), [
    ("_int_attr", "half", "attribute 'half' should be an integer, not float64 '2.5'"),
    ("_int_attr", "name", "attribute 'name' should be an integer, not text 'alibi'"),
    ("_int_attr", "pair", "attribute 'pair' should be an integer, not int64 of shape (2,)"),
    ("_str_attr", "n", "attribute 'n' should be text, not int64 '5'"),
    ("_bool_attr", "name", "attribute 'name' should be true or false, not <U5 'alibi'"),
    ("_bool_attr", "half", "attribute 'half' should be true or false, not float64 '2.5'"),
])  # fmt: skip
def test_a_wrong_type_is_one_error_naming_the_attribute(attrs_file: Path, read: str, key: str, words: str) -> None:
    with h5py.File(attrs_file) as f, pytest.raises(BiasvizError) as exc:
        getattr(checks(f, attrs_file), read)(key)
    assert str(exc.value) == f"{attrs_file} is not a valid biasviz file: {words}; extract it again"


def test_an_integer_below_its_minimum_is_refused(attrs_file: Path) -> None:
    with h5py.File(attrs_file) as f:
        c = checks(f, attrs_file)
        assert c._int_attr("n", minimum=5) == 5  # the minimum itself is allowed
        with pytest.raises(BiasvizError, match="attribute 'zero' is 0, expected at least 1"):
            c._int_attr("zero", minimum=1)


def test_links_and_storage_in_other_files_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(4.0)
    (tmp_path / "raw.bin").write_bytes(np.arange(4, dtype="<f4").tobytes())
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["own"] = np.arange(3)
        f.create_group("g/sub")["link"] = h5py.ExternalLink("other.h5", "x")  # never followed
        f.create_dataset("external", shape=(4,), dtype="<f4", external=[(str(tmp_path / "raw.bin"), 0, 16)])
        layout = h5py.VirtualLayout(shape=(4,), dtype="f8")
        layout[:] = h5py.VirtualSource(str(other), "x", shape=(4,))
        f.create_virtual_dataset("virtual", layout)
        f.create_group("group")
    with h5py.File(path) as f:
        c = checks(f, path)
        c._refuse_other_files("own")
        with pytest.raises(BiasvizError, match=r"'g/sub/link' is an external link to another file \(other\.h5\)"):
            c._refuse_other_files("g/sub/link")
        for name in ("external", "virtual"):
            with pytest.raises(BiasvizError, match=f"'{name}' keeps its data in another file"):
                c._refuse_other_files(name)
            with pytest.raises(BiasvizError, match="keeps its data in another file"):
                c._dataset(name)
        with pytest.raises(BiasvizError, match="another file"):
            c._refuse_other_files_anywhere()
        assert c._dataset("absent") is None
        assert c._dataset("own")[()].tolist() == [0, 1, 2]
        with pytest.raises(BiasvizError, match="'group' is not a dataset"):
            c._dataset("group")


def test_a_file_of_its_own_data_passes_and_a_deep_link_anywhere_is_found(tmp_path: Path) -> None:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["a/b/c"] = np.zeros(2)
        f["a/soft"] = h5py.SoftLink("/a/b/c")  # a link inside the file is its own data
    with h5py.File(path) as f:
        checks(f, path)._refuse_other_files_anywhere()
    with h5py.File(path, "a") as f:
        f["a/b/far"] = h5py.ExternalLink("x" * 100 + ".h5", "/d")
    with h5py.File(path) as f, pytest.raises(BiasvizError) as exc:
        checks(f, path)._refuse_other_files_anywhere()
    assert f"'a/b/far' is an external link to another file ({'x' * 60}...)" in str(exc.value)


def test_plain_data_decodes_bytes_and_unwraps_numpy() -> None:
    assert plain(b"caf\xc3\xa9") == "café"
    assert plain(b"\xff") == "\ufffd"  # undecodable bytes replaced, never an error
    assert plain(np.int64(3)) == 3 and type(plain(np.int64(3))) is int
    assert plain(np.float32(0.5)) == 0.5 and type(plain(np.float32(0.5))) is float
    assert plain(np.array([1, 2, 3])) == [1, 2, 3]
    assert plain(np.array([b"a", b"b"])) == ["a", "b"]
    assert plain(np.array(["x", b"y"], dtype=object)) == ["x", "y"]
    assert plain((b"a", np.int8(1), [b"c"])) == ["a", 1, ["c"]]
    assert plain(np.void(b"\x01\x02")) == "\x01\x02"  # an opaque value's bytes, decoded as any bytes are
    assert plain("\udcff") == "\\udcff"  # a lone surrogate (undecodable bytes, as h5py keeps them) as an escape


def test_text_escapes_only_what_cannot_be_printed() -> None:
    assert text("plain é ∑") == "plain é ∑"
    assert text("a\udc80b") == "a\\udc80b"


def test_short_text_keeps_sixty_characters() -> None:
    assert short_text("x" * 60) == "x" * 60
    assert short_text("x" * 61) == "x" * 60 + "..."
    assert short_text("abcdef", limit=3) == "abc..."


def test_describe_says_what_a_value_is_without_its_whole_text() -> None:
    assert describe("alibi") == "text 'alibi'"
    assert describe("y" * 41) == f"text '{'y' * 40}'..."
    assert describe(np.float64(2.5)) == "float64 '2.5'"
    assert describe(np.zeros((2, 3), np.float32)) == "float32 of shape (2, 3)"
    assert describe(np.array(10**50, dtype=object)).startswith("object '") and len(describe(10**50)) < 60


def test_shape_text_is_type_and_shape(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        ds = f.create_dataset("x", shape=(12, 16, 16), dtype="f2")
        assert shape_text(ds) == "float16 (12, 16, 16)"
