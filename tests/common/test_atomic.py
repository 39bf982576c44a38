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


def test_a_signal_as_the_file_lands_is_handled_after_the_publish_hook(tmp_path, monkeypatch) -> None:
    """when_published: SIGINT held back across the move and the hook (an extract's output_in_place, which then
    ignores it); the handler sees it only after both."""
    import os
    import signal

    from biasviz.common import atomic

    order: list[str] = []
    real_move = atomic._move

    def move_then_signal(tmp, target, overwrite) -> None:
        real_move(tmp, target, overwrite)
        order.append("moved")
        os.kill(os.getpid(), signal.SIGINT)  # as the file lands

    monkeypatch.setattr(atomic, "_move", move_then_signal)
    previous = signal.signal(signal.SIGINT, lambda *_: order.append("signal"))
    import threading

    done = threading.Event()  # another thread, as torch's and the writer's pools: the kernel may hand it the signal
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        atomic.when_published(lambda: order.append("hook"))
        (tmp_path / "new").write_text("complete")
        atomic.publish(tmp_path / "new", tmp_path / "out")
    finally:
        done.set()
        other.join()
        signal.signal(signal.SIGINT, previous)
    assert order == ["moved", "hook", "signal"]
    assert (tmp_path / "out").read_text() == "complete"
