"""Nothing trusted, nothing lost: what biasviz makes beside an output, outputs raced for, settings, the notebook API.

Each case is run from the user's side (the CLI in this process, or ``biasviz.open``) on tiny inputs, and checks
one clear ``Error:`` line (or exception), and that nothing is created outside the output's folder or lost.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli, small_model
from tests.project.test_untrusted import write_valid


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trust")
    small_model("alibi", n_layer=1).save_pretrained(root / "ck")
    return {"ck": root / "ck", "good": write_valid(root / "good.h5")}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's working folder, and beside it a folder ``elsewhere`` that nothing may write into."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "work"


def one_error(code: int, err: str, pattern: str = "") -> str:
    """The single ``Error:`` line of a failed command (and no traceback)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("Error: "), (code, err)
    assert pattern in lines[0], lines[0]
    return lines[0]


def bias_only(ck: Path, out: str, *more: str) -> list[str]:
    return ["extract", "--model", str(ck), "--bias-only", "--seq-len", "8", "--quiet", "--out", out, *more]


# -- 1. files next to the output ---------------------------------------------------------------------------


def test_a_link_planted_at_the_lock_creates_nothing_elsewhere(assets: dict[str, Path], here: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """A dangling link at ``.x.h5.lock`` is refused, not followed: the old code created ``elsewhere/planted``."""
    planted = here.parent / "elsewhere" / "planted"
    (here / ".x.h5.lock").symlink_to(planted)
    code, _, err = run_cli(bias_only(assets["ck"], "x.h5"), capsys)
    one_error(code, err, ".x.h5.lock is a symbolic link")
    assert not planted.exists() and not planted.is_symlink()
    assert sorted(p.name for p in here.iterdir()) == [".x.h5.lock"]


def test_a_link_raced_in_at_a_temporary_name_is_never_written_through(
        assets: dict[str, Path], here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """A link that appears at the JSON's temporary name after biasviz cleared it: refused, nothing elsewhere."""
    import biasviz.common.atomic as atomic

    planted = here.parent / "elsewhere" / "planted.json"
    clear = atomic.remove_path

    def clear_then_plant(path: Path) -> None:
        clear(path)
        if path.name.endswith(".tmp") and path.name.startswith(".d.json."):
            path.symlink_to(planted)

    monkeypatch.setattr(atomic, "remove_path", clear_then_plant)
    code, _, err = run_cli(["diagnose", str(assets["good"]), "--json", "d.json", "--no-figures"], capsys)
    one_error(code, err, "is a symbolic link")
    assert not planted.exists()
    assert not (here / "d.json").exists() and not (here / "d.json").is_symlink()


LOOPS = [
    ("extract --out", lambda a: bias_only(a["ck"], "loop"), "--out"),
    ("extract --out inside", lambda a: bias_only(a["ck"], "loop/x.h5", "--force"), "--out"),
    ("diagnose --json", lambda a: ["diagnose", str(a["good"]), "--json", "loop", "--no-figures"], "--json"),
    ("explore --out --force", lambda a: ["explore", str(a["good"]), "--out", "loop", "--force"], "--out"),
    ("plot --out-dir", lambda a: ["plot", "--scheme", "alibi", "--input", str(a["good"]), "--out-dir", "loop",
                                  "--format", "png"], "--out-dir"),  # fmt: skip
]


@pytest.mark.parametrize(("name", "argv", "option"), LOOPS, ids=[c[0] for c in LOOPS])
def test_an_output_that_is_a_link_loop_is_one_error(assets: dict[str, Path], here: Path,
                                                    capsys: pytest.CaptureFixture[str], name: str,
                                                    argv: object, option: str) -> None:  # fmt: skip
    os.symlink("loop", here / "loop")
    code, _, err = run_cli(argv(assets), capsys)  # type: ignore[operator]
    line = one_error(code, err, "symbolic link loop")
    assert line.endswith(f"choose another {option}"), line
    assert sorted(p.name for p in here.iterdir()) == ["loop"]


# -- 2. races on outputs that must not be overwritten --------------------------------------------------------

RACED = [
    ("diagnose --json", lambda a: ["diagnose", str(a["good"]), "--json", "out", "--no-figures"], "--json"),
    ("explore --out", lambda a: ["explore", str(a["good"]), "--out", "out"], "--out"),
    ("extract --out", lambda a: bias_only(a["ck"], "out"), "--out"),
    ("extract --out --resolution", lambda a: bias_only(a["ck"], "out", "--resolution", "4"), "--out"),
]


@pytest.mark.parametrize(("name", "argv", "option"), RACED, ids=[c[0] for c in RACED])
def test_the_first_of_two_writers_wins_and_keeps_its_file(assets: dict[str, Path], here: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, name: str, argv: object,
                                                         option: str) -> None:  # fmt: skip
    """Another process creates ``out`` just before this one moves its finished file there (after every check):
    this one fails with one line, and the winner's file stays as it was."""
    import biasviz.common.atomic as atomic
    import biasviz.store.writer as writer

    target = here / "out"
    move = atomic.publish

    def other_process_wins(tmp: Path, path: Path, **kwargs: bool) -> None:
        if Path(path).name == "out" and not target.exists():
            target.write_text("the winner's work")
        move(tmp, path, **kwargs)

    monkeypatch.setattr(atomic, "publish", other_process_wins)
    monkeypatch.setattr(writer, "publish", other_process_wins)
    code, _, err = run_cli(argv(assets), capsys)  # type: ignore[operator]
    line = one_error(code, err, "out already exists")
    assert line.endswith(f"choose another {option}"), line
    assert target.read_text() == "the winner's work"
    assert sorted(p.name for p in here.iterdir()) == ["out"]


# -- 3. settings and small lies ---------------------------------------------------------------------------------

SETTINGS = [
    ("BIASVIZ_ATTENTION for extract", {"BIASVIZ_ATTENTION": "garbage"}, lambda a: bias_only(a["ck"], "x.h5"),
     "BIASVIZ_ATTENTION='garbage' is not one of auto, flex, table, sdpa"),
    ("BIASVIZ_ATTENTION for train", {"BIASVIZ_ATTENTION": "Fast"}, lambda a: ["train", "--scheme", "alibi",
     "--out", "x"], "BIASVIZ_ATTENTION='Fast' is not one of auto"),  # fmt: skip
    ("a device given twice", {}, lambda a: ["extract", "--model", str(a["ck"]), "--device-map", "auto",
     "--max-memory", "cpu=1GiB,cpu=600000", "--out", "x.h5"], "--max-memory names cpu twice"),  # fmt: skip
    ("a size of 400 digits", {}, lambda a: ["extract", "--model", str(a["ck"]), "--device-map", "auto",
     "--max-memory", "cpu=" + "9" * 400, "--out", "x.h5"], "is more than any machine has"),  # fmt: skip
]


@pytest.mark.parametrize(("name", "env", "argv", "said"), SETTINGS, ids=[c[0] for c in SETTINGS])
def test_a_setting_biasviz_does_not_know_is_one_error(
        assets: dict[str, Path], here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        name: str, env: dict[str, str], argv: object, said: str) -> None:  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, _, err = run_cli(argv(assets), capsys)  # type: ignore[operator]
    line = one_error(code, err, said)
    assert len(line) < 200, line
    assert list(here.iterdir()) == []


def test_a_resolution_above_the_length_is_the_exact_map(assets: dict[str, Path], here: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """docs/hdf5.md, 'Summary files': R >= T gives blocks of one position (exact per cell), the same maps as R = T."""
    import h5py
    import numpy as np

    for r in (48, 64):
        code, _, err = run_cli(bias_only(assets["ck"], f"r{r}.h5", "--seq-len", "48", "--resolution", str(r)),
                               capsys)  # fmt: skip
        assert code == 0, err
    with h5py.File("r48.h5") as exact, h5py.File("r64.h5") as above:
        assert above.attrs["resolution"] == 64 and above.attrs["block"] == 1
        np.testing.assert_array_equal(above["layer_0/bias_mean"][()], exact["layer_0/bias_mean"][()])


def test_a_library_warning_is_one_warning_line(assets: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Not ``/path/to/lib.py:12: UserWarning: ...`` and a line of the library's source."""
    import warnings

    import biasviz.cli.info_cmd as info_cmd

    summary = info_cmd.summary

    def warns(path: Path) -> str:
        warnings.warn("the library says\n  something", UserWarning, stacklevel=1)
        return summary(path)

    monkeypatch.setattr(info_cmd, "summary", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, out, err = run_cli(["info", str(assets["good"])], capsys)
    assert code == 0 and "good.h5" in out
    assert err == "Warning: the library says something\n"


# -- 4. the notebook API's arguments ----------------------------------------------------------------------------


def write_small_sweep(path: Path, steps: tuple[int, ...] = (0, 1, 2), heads: int = 3, n: int = 2, t: int = 8) -> Path:
    """A sweep whose steps are 0, 1, 2: where the string '1' was once "not in" a file holding step 1."""
    import numpy as np

    from biasviz.store import BiasFileWriter
    from tests.conftest import SYNTHETIC_ATTRS, softmax_weights, synthetic_bias

    meta = {**SYNTHETIC_ATTRS, "scheme": "alibi", "context_dependent": False}
    with BiasFileWriter(path, attrs=meta, n_samples=n, n_heads=heads, seq_len=t, layers=[1], has_bias=True,
                        checkpoints=list(steps), force=True) as writer:  # fmt: skip
        writer.begin_batch(np.zeros((n, t), np.int32))
        for c in range(len(steps)):
            bias = synthetic_bias("alibi", n, heads, t) * (c + 1)
            for s in range(n):
                for h in range(heads):
                    writer.write_matrix("bias", 1, s, h, bias[s, h], checkpoint=c)
                    writer.write_matrix("weights", 1, s, h, softmax_weights(bias)[s, h], checkpoint=c)
    return path


@pytest.fixture(scope="module")
def views(assets: dict[str, Path]) -> Any:
    import biasviz

    full = biasviz.open(assets["good"])  # layer 1, heads 1 to 3, samples 0 and 1
    sweep = biasviz.open(write_small_sweep(assets["good"].with_name("sweep.h5")))
    yield {"full": full, "sweep": sweep}
    full.close()
    sweep.close()


def test_numpy_integers_index_as_python_integers_do(views: dict[str, Any]) -> None:
    import numpy as np

    full, sweep = views["full"], views["sweep"]
    np.testing.assert_array_equal(full.bias(layer=np.int64(1), head=np.int32(2), sample=np.int64(1)),
                                  full.bias(layer=1, head=2, sample=1))  # fmt: skip
    np.testing.assert_array_equal(sweep.weights(step=np.int64(1), sample=np.uint8(0)), sweep.weights(step=1, sample=0))
    assert full.to_xarray(layer=np.int64(-1))["bias"].shape == (2, 3, 8, 8)


WRONG = [
    ("full", {"layer": 1.0}, TypeError, "layer must be an integer, not 1.0 (float); "),
    ("full", {"layer": 1.5}, TypeError, "good.h5 holds layers 1, and -1 is the last"),
    ("full", {"layer": "1"}, TypeError, "layer must be an integer, not '1' (str)"),
    ("full", {"layer": None}, TypeError, "layer must be an integer, not None"),
    ("full", {"layer": 4}, ValueError, "layer 4 is not in "),
    ("full", {"head": "3"}, TypeError, "head must be an integer, not '3' (str); heads are numbered 1 to 3"),
    ("full", {"head": True}, TypeError, "head must be an integer, not True (bool)"),
    ("full", {"head": 4}, ValueError, "head 4 is not in "),
    ("full", {"sample": 0.5}, TypeError, "good.h5 holds samples 0, 1"),
    ("full", {"sample": "all"}, ValueError, "sample must be an index, 'mean' or None"),
    ("full", {"step": 1}, ValueError, "is not a sweep"),
    ("sweep", {"step": "1"}, TypeError, "step must be an integer, not '1' (str)"),
    ("sweep", {"step": 1.0}, TypeError, "step must be an integer, not 1.0 (float)"),
    ("sweep", {"step": 3}, ValueError, "step 3 is not in "),
]


@pytest.mark.parametrize(("which", "kwargs", "kind", "said"), WRONG, ids=[f"{w[0]}-{w[1]}" for w in WRONG])
def test_a_wrong_argument_names_itself_and_what_it_may_be(views: dict[str, Any], which: str, kwargs: dict[str, Any],
                                                          kind: type[Exception], said: str) -> None:  # fmt: skip
    for method in ("bias", "weights"):
        with pytest.raises(kind) as caught:
            getattr(views[which], method)(**kwargs)
        message = str(caught.value)
        assert said in message, message
        value = next(iter(kwargs.values()))
        if "is not in" in message:  # never "step 1 is not in the file; it holds steps 0, 1, 2"
            listed = message.rsplit("holds ", 1)[-1]
            assert str(value) not in listed.replace(" to ", ",").split(","), message


def test_view_index_and_plot_and_explore_arguments_are_checked(views: dict[str, Any]) -> None:
    full = views["full"]
    with pytest.raises(TypeError, match=r"view\[\.\.\.\] takes a dataset name .* not 0 \(int\)"):
        full[0]
    with pytest.raises(TypeError, match=r"layer must be an integer, not 1\.5 \(float\)"):
        full.plot(layer=1.5)
    with pytest.raises(TypeError, match=r"layer must be an integer, not 'x' \(str\)"):
        full.explore(layer="x")


def test_every_call_after_close_says_the_view_is_closed(assets: dict[str, Path]) -> None:
    import biasviz

    view = biasviz.open(assets["good"])
    view.close()
    view.close()  # again: nothing
    assert "closed" in repr(view)
    calls = [lambda: view.bias(), lambda: view.weights(head=1), lambda: view.layers, lambda: view["input_ids"],
             lambda: view.keys(), lambda: view.dims("input_ids"), lambda: view.plot(), lambda: view.explore(),
             lambda: view.to_xarray()]  # fmt: skip
    for call in calls:
        with pytest.raises(ValueError, match=r"this view of .*good\.h5 is closed; open the file again"):
            call()


# -- 5. size before work -------------------------------------------------------------------------------------------

DEEP = "[" * 50000 + "]" * 50000  # Python's parser recursed once a level: a RecursionError


def _edited_config(key: str, value: object) -> Callable[[Path], None]:
    def edit(ck: Path) -> None:
        config = json.loads((ck / "config.json").read_text())
        config[key] = "DEEP" if value is DEEP else value
        (ck / "config.json").write_text(json.dumps(config).replace('"DEEP"', DEEP))

    return edit


CLAIMS = [
    ("zero heads", _edited_config("n_head", 0), "/ck: n_head must be a whole number of at least 1, not 0"),
    ("100000 layers", _edited_config("n_layer", 100000), "(100000 layers of width 48), but its weights"),
    ("a config nested 50000 deep", _edited_config("extra", DEEP), "config.json nests arrays or objects more than 64"),
]


@pytest.mark.parametrize(("name", "edit", "said"), CLAIMS, ids=[c[0] for c in CLAIMS])
def test_a_checkpoint_that_claims_too_much_is_refused_before_work(
        assets: dict[str, Path], here: Path, capsys: pytest.CaptureFixture[str], name: str,
        edit: Callable[[Path], None], said: str) -> None:  # fmt: skip
    ck = here / "ck"
    shutil.copytree(assets["ck"], ck)
    edit(ck)
    code, _, err = run_cli(bias_only(ck, "x.h5"), capsys)
    one_error(code, err, said)
    assert sorted(p.name for p in here.iterdir()) == ["ck"]


def _deep_training_json(here: Path, assets: dict[str, Path]) -> list[str]:
    shutil.copytree(assets["ck"], here / "ck")
    (here / "ck" / "training.json").write_text('{"settings": ' + DEEP + "}")
    return bias_only(here / "ck", "x.h5")


def _deep_attribute(here: Path, assets: dict[str, Path]) -> list[str]:
    import h5py

    shutil.copy(assets["good"], here / "deep.h5")
    with h5py.File(here / "deep.h5", "r+") as f:
        f.attrs["training"] = DEEP
    return ["diagnose", str(here / "deep.h5"), "--json", "d.json", "--no-figures"]


def _deep_map(here: Path, assets: dict[str, Path]) -> list[str]:
    (here / "map.json").write_text('{"lm_head": ' + DEEP + "}")
    return ["extract", "--model", str(assets["ck"]), "--device-map", "map.json", "--out", "x.h5"]


DEEP_CASES = [  # (name, the command, the Error line; None: not what biasviz wrote, left unread, the command works)
    ("a device map", _deep_map, "map.json nests arrays or objects more than 64 levels deep"),
    ("--scheme-options", lambda h, a: ["train", "--scheme", "alibi", "--scheme-options", DEEP, "--out", "x"],
     "--scheme-options nests arrays or objects more than 64 levels deep"),
    ("a training.json", _deep_training_json, None),
    ("an HDF5 attribute", _deep_attribute, None),
]


@pytest.mark.parametrize(("name", "argv", "said"), DEEP_CASES, ids=[c[0] for c in DEEP_CASES])
def test_deep_json_from_outside_is_one_error_or_left_unread(
        assets: dict[str, Path], here: Path, capsys: pytest.CaptureFixture[str], name: str,
        argv: Callable[[Path, dict[str, Path]], list[str]], said: str | None) -> None:  # fmt: skip
    code, _, err = run_cli(argv(here, assets), capsys)
    if said is not None:
        one_error(code, err, said)
    else:
        assert code == 0 and "Traceback" not in err, err
