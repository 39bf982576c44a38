"""The one way biasviz writes: whole new file (or directory) or the old one untouched, never a temporary left."""

from __future__ import annotations

import pytest

from biasviz.common.atomic import publish, replacing, temporary_name, write_text


def test_an_error_keeps_the_old_file_and_leaves_nothing(tmp_path) -> None:
    target = tmp_path / "fig.pdf"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["fig.pdf"]


def test_a_directory_is_replaced_whole(tmp_path) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "old.bin").write_text("x")
    with replacing(out) as tmp:
        tmp.mkdir()
        (tmp / "model.safetensors").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_without_overwrite_a_file_that_appeared_is_kept(tmp_path) -> None:
    target = tmp_path / "data.h5"
    tmp = temporary_name(target)
    tmp.write_text("mine")
    target.write_text("theirs")
    with pytest.raises(FileExistsError):
        publish(tmp, target, overwrite=False)
    assert target.read_text() == "theirs"
    write_text(target, "replaced")
    assert target.read_text() == "replaced"
