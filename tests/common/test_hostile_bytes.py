"""Names that are not UTF-8: Linux allows them (``b'caf\\xe9.txt'``, Python's ``'caf\\udce9.txt'``), so every command
reads and writes them where the user points, and records them in its files' metadata (HDF5 attributes, PNG and
PDF text, JSON, the explorer page) as valid UTF-8 text that tells the name apart (``caf\\xe9.txt``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import h5py
import pytest

from biasviz.common.names import display_name, name_bytes, utf8_path, utf8_text
from tests.conftest import run_cli
from tests.hostile import BIASVIZ, make_assets

EX = ["--seq-len", "8", "--samples", "1", "--quiet"]
TRAIN = ["train", "--scheme", "alibi", "--steps", "1", "--seq-len", "8", "--batch-size", "1", "--device", "cpu",
         "--quiet"]  # fmt: skip


def odd(name: str) -> str:
    """``name`` with its ``é`` as the Latin-1 byte 0xE9: a name Linux allows that is not UTF-8."""
    return os.fsdecode(name.encode("latin-1"))


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_assets(tmp_path_factory.mktemp("bytes"))


def ok(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    assert code == 0, err


def recorded(text: str, path: Path) -> None:
    """``text`` (the record of ``path``) is valid UTF-8, shows the byte as ``\\xe9``, and gives the path back."""
    text.encode("utf-8")
    assert "\\xe9" in text, text
    assert name_bytes(text) in (os.fsencode(path), os.fsencode(path.resolve())), text


@pytest.mark.parametrize(
    "name", ["plain.txt", "données/a b.txt", "caf\udce9.txt", "a\\xe9.txt", "back\\slash\udcff\\", "\udc80"]
)
def test_display_names_are_utf8_and_tell_names_apart(name: str) -> None:
    shown = display_name(name)
    shown.encode("utf-8")
    assert name_bytes(shown) == os.fsencode(name)
    assert display_name(os.fsencode(name)) == shown
    assert utf8_text(shown) == shown  # the net under metadata writers leaves a displayed name as it is
    if "\\" not in name and name.isprintable() and not any("\udc80" <= c <= "\udcff" for c in name):
        assert shown == name  # valid names are recorded as they were


def test_utf8_path_names_the_same_file(tmp_path: Path) -> None:
    folder = tmp_path / odd("dé")
    folder.mkdir()
    (folder / "f.txt").write_text("x")
    alias = utf8_path(folder / "f.txt")
    alias.encode("utf-8")
    assert Path(alias).read_text() == "x"
    assert utf8_path(tmp_path / "f.txt") == str(tmp_path / "f.txt")


def test_extract_text_not_utf8(assets: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: UnicodeEncodeError (a traceback) writing the attribute text_source."""
    text = tmp_path / odd("café.txt")
    shutil.copy(assets["text"], text)
    out = tmp_path / "e.h5"
    ok(*run_cli(["extract", "--model", assets["alibi"], "--text", str(text), "--out", str(out), *EX], capsys)[::2])
    with h5py.File(out) as f:
        recorded(f.attrs["text_source"], text)


def test_extract_model_folder_not_utf8(assets: dict[str, str], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: SafetensorError (a traceback): safetensors opens only paths that are valid UTF-8."""
    model = tmp_path / odd("modél")
    shutil.copytree(assets["alibi"], model)
    out = tmp_path / odd("é.h5")
    ok(*run_cli(["extract", "--model", str(model), "--text", assets["text"], "--out", str(out), *EX], capsys)[::2])
    with h5py.File(out) as f:
        recorded(f.attrs["source_model"], model)
        assert "\\xe9" in f.attrs["tokenizer"]  # the checkpoint's own tokenizer.json, read from that folder


def test_train_into_folder_not_utf8(assets: dict[str, str], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: UnicodeEncodeError (a traceback) from tokenizers saving tokenizer.json; the checkpoint then loads."""
    corpus = tmp_path / odd("café.txt")
    shutil.copy(assets["text"], corpus)
    out = tmp_path / odd("runé") / "ck"
    ok(*run_cli([*TRAIN, "--corpus", str(corpus), "--out", str(out)], capsys)[::2])
    assert {"config.json", "model.safetensors", "tokenizer.json", "training.json"} <= {p.name for p in out.iterdir()}
    doc = json.loads((out / "training.json").read_bytes().decode("utf-8"))  # valid UTF-8, no lone surrogates
    recorded(doc["corpus_source"], corpus)
    recorded(doc["settings"]["corpus"], corpus)
    ok(*run_cli(["extract", "--model", str(out), "--text", str(corpus), "--out", str(out.parent / "e.h5"), *EX],
                capsys)[::2])  # fmt: skip
    with h5py.File(out.parent / "e.h5") as f:
        recorded(f.attrs["source_model"], out)
        json.loads(f.attrs["training"])


def _png_source(path: Path) -> str:
    from PIL import Image

    with Image.open(path) as image:
        return image.text["Source"]


def _strings(doc: object) -> list[str]:
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in _strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return [doc] if isinstance(doc, str) else []


@pytest.mark.parametrize("command", ["plot", "diagnose", "explore"])
def test_figures_and_pages_of_a_file_not_utf8(assets: dict[str, str], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str], command: str) -> None:  # fmt: skip
    """Old code: UnicodeEncodeError (a traceback) writing the PNG text chunk (plot), the PDF document info
    (diagnose) and the HTML page (explore)."""
    source = tmp_path / odd("goéd.h5")
    shutil.copy(assets["good"], source)
    out = tmp_path / odd("figé")
    argv = {"plot": ["plot", "--scheme", "alibi", "--input", str(source), "--format", "png,pdf", "--out-dir", str(out)],
            "diagnose": ["diagnose", str(source), "--format", "png,pdf", "--out-dir", str(out), "--json",
                         str(out / odd("dé.json"))],
            "explore": ["explore", str(source), "--out", str(out / odd("pé.html"))]}[command]  # fmt: skip
    ok(*run_cli(argv, capsys)[::2])
    if command == "plot":
        recorded(_png_source(out / "alibi_bias.png"), source)
        assert (out / "alibi_bias.pdf").stat().st_size > 0
    elif command == "diagnose":
        doc = json.loads((out / odd("dé.json")).read_bytes().decode("utf-8"))
        recorded(next(s for s in _strings(doc) if "xe9" in s), source)
        assert (out / "diagnostics.pdf").stat().st_size > 0
        assert "\\xe9" in _png_source(out / "diagnostics.png")
    else:
        page = (out / odd("pé.html")).read_bytes().decode("utf-8")
        assert "<title>biasviz explorer: go\\xe9d</title>" in page


def test_under_the_c_locale(assets: dict[str, str], tmp_path: Path) -> None:
    """The installed script with LC_ALL=C (ASCII everywhere): names not UTF-8 in, figures out where asked.
    Old code: UnicodeEncodeError (a traceback) writing the PNG text chunk."""
    source = tmp_path / odd("goéd.h5")
    shutil.copy(assets["good"], source)
    out = tmp_path / odd("figé")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": ""}
    env.pop("PYTHONUTF8", None)
    argv = ["plot", "--scheme", "alibi", "--input", source, "--format", "png", "--out-dir", out]
    proc = subprocess.run([BIASVIZ, *argv], capture_output=True, timeout=120, env=env)
    err = proc.stderr.decode("utf-8", "replace")
    ok(proc.returncode, err)
    assert f"wrote {display_name(out)}/alibi_bias.png".encode() in proc.stdout  # printed escaped, as recorded
    recorded(_png_source(out / "alibi_bias.png"), source)


def test_messages_quote_such_names_escaped(assets: dict[str, str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A "wrote" line on stdout and an ``Error:`` line on stderr, each quoting a name that is not UTF-8, through the
    strict streams of a UTF-8 terminal (an ASCII one: Click writes such text with '?' itself).
    Old code: UnicodeEncodeError (a traceback) from click.echo, after the output was written."""
    import io

    from biasviz.cli import main

    source = tmp_path / odd("goéd.h5")
    shutil.copy(assets["good"], source)
    got = {}
    for argv in (["diagnose", str(source), "--no-figures", "--json", str(tmp_path / odd("dé.json"))],
                 ["explore", str(tmp_path / odd("missé.h5"))]):  # fmt: skip
        out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict") for _ in range(2))
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setattr("sys.stderr", err)
        with pytest.raises(SystemExit) as exit_:
            main(argv)
            raise SystemExit(0)
        out.flush()
        err.flush()
        got[argv[0]] = (exit_.value.code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode())
    monkeypatch.undo()
    code, out_text, _ = got["diagnose"]
    assert code == 0 and f"wrote {display_name(tmp_path / odd('dé.json'))}" in out_text, got
    code, _, err_text = got["explore"]
    lines = err_text.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), got
    assert display_name(odd("missé.h5")) in lines[0], lines
