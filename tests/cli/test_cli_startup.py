"""The installed script keeps the garbage collector off the objects its imports and model load make; ``main(argv)``
called from Python leaves the caller's collector as it was."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import biasviz.cli as cli
from biasviz.data import build_tokenizer, save_tokenizer
from tests.conftest import small_model


@pytest.fixture
def restored_collector():  # noqa: ANN201
    """Whatever a test froze is handed back to the collector, and the collector is on again."""
    yield
    gc.unfreeze()
    gc.enable()


def test_lasting_objects_pauses_then_freezes_in_the_script(monkeypatch, restored_collector) -> None:
    monkeypatch.setattr(cli, "_SCRIPT", True)
    before = gc.get_freeze_count()
    with cli.lasting_objects():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)


def test_lasting_objects_turns_the_collector_back_on_after_an_error(monkeypatch, restored_collector) -> None:
    monkeypatch.setattr(cli, "_SCRIPT", True)
    with pytest.raises(RuntimeError), cli.lasting_objects():
        raise RuntimeError("a load that failed")
    assert gc.isenabled()


def test_lasting_objects_leaves_a_python_caller_alone(monkeypatch, restored_collector) -> None:
    monkeypatch.setattr(cli, "_SCRIPT", False)
    before = gc.get_freeze_count()
    with cli.lasting_objects():
        assert gc.isenabled()
        _ = [[i] for i in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == before


@pytest.mark.slow
def test_script_extract_freezes_torch_and_ends_with_the_collector_on(tmp_path) -> None:
    """``main()`` as the script runs it: torch's and transformers' objects are frozen, the collector is on, and the
    file is written; ``main(argv)`` in the same kind of process freezes nothing."""
    text = "\n".join(f"def f{i}(x):\n    return x * {i}" for i in range(300))
    small_model("alibi", vocab_size=300).save_pretrained(tmp_path / "m")
    save_tokenizer(build_tokenizer([text], 300), tmp_path / "m")
    (tmp_path / "t.txt").write_text(text)
    args = ["extract", "--model", str(tmp_path / "m"), "--text", str(tmp_path / "t.txt"), "--seq-len", "16",
            "--samples", "2", "--summary", "--quiet", "--out", str(tmp_path / "s.h5"), "--force"]  # fmt: skip
    probe = """if True:
        import gc, sys
        from biasviz.cli import main
        script, sys.argv = sys.argv[1] == "script", ["biasviz", *sys.argv[2:]]
        try:
            main() if script else main(sys.argv[1:])
        except SystemExit as e:
            assert not e.code, e.code
        print(gc.isenabled(), gc.get_freeze_count(), "torch" in sys.modules)
    """
    for mode in ("script", "python"):
        done = subprocess.run([sys.executable, "-c", probe, mode, *args], capture_output=True, text=True, check=True)
        enabled, frozen, torch_loaded = done.stdout.split()[-3:]
        assert enabled == "True" and torch_loaded == "True" and (tmp_path / "s.h5").is_file()
        assert int(frozen) > 100_000 if mode == "script" else int(frozen) == 0
