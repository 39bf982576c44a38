"""Sweeps refuse checkpoints that do not belong together (another scheme, configuration or shapes), naming the
odd one, before any model is loaded; what differs only in how it was saved passes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli, small_model

VOCAB = 300
TEXT = "def f(x):\n    return x * 2  # doubled\n" * 200


def _edit_config(**changes: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(changes)
        (folder / "config.json").write_text(json.dumps(cfg))

    return edit


def _reshape_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    key = next(k for k in sorted(state) if k.endswith("weight") and state[k].dim() == 2)
    state[key] = state[key][:, :-1].contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _drop_tensor(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state.pop(sorted(state)[-1])
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _damage_config(folder: Path) -> None:
    (folder / "config.json").write_text("{not json")


#: (name, what the odd checkpoint-200 is: a model's overrides or an edit of a good copy, the error's pattern)
ODD = [
    ("another scheme", {"scheme": "fire"}, None, r"config scheme: alibi against fire"),
    ("more layers", {"n_layer": 3}, None, r"n_layer"),
    ("another width", {"n_embd": 96}, None, r"n_embd"),
    ("another vocabulary", {"vocab_size": 301}, None, r"vocab_size"),
    ("more heads", {"n_head": 6}, None, r"n_head"),
    ("another positional length", {"n_positions": 512}, None, r"n_positions"),
    ("a tensor of another shape", {}, _reshape_tensor, r"tensor .*weight"),
    ("a tensor missing", {}, _drop_tensor, r"tensor .*absent"),
    ("scheme options differ", {}, _edit_config(scheme_options={"slopes": "interleaved"}), r"scheme_options"),
    ("a damaged config", {}, _damage_config, r"config\.json cannot be read as JSON"),
]  # fmt: skip


def _series(root: Path, odd: dict[str, object], edit: Callable[[Path], None] | None) -> None:
    for k, step in enumerate((0, 100, 200, 300)):
        overrides = {"vocab_size": VOCAB, **(odd if step == 200 else {})}
        scheme = str(overrides.pop("scheme", "alibi"))
        small_model(scheme, seed=k, **overrides).save_pretrained(root / f"checkpoint-{step}")
        if step == 200 and edit is not None:
            edit(root / f"checkpoint-{step}")


@pytest.mark.parametrize(("name", "odd", "edit", "pattern"), ODD, ids=[c[0] for c in ODD])
def test_a_checkpoint_of_another_run_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       name: str, odd: dict[str, object],
                                                       edit: Callable[[Path], None] | None, pattern: str) -> None:
    import re

    from biasviz.data import build_tokenizer, save_tokenizer

    root = tmp_path / "run"
    _series(root, odd, edit)
    (tmp_path / "t.txt").write_text(TEXT)
    tok = save_tokenizer(build_tokenizer([TEXT], VOCAB), tmp_path)
    out = tmp_path / "sweep.h5"
    code, _, err = run_cli(["extract", "--model", str(root), "--checkpoints", "all", "--text", str(tmp_path / "t.txt"),
                            "--tokenizer", str(tok), "--seq-len", "8", "--samples", "1", "--quiet", "--out", str(out)],
                           capsys)  # fmt: skip
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "checkpoint-200" in lines[0] and re.search(pattern, lines[0]), lines[0]
    assert not out.exists() and not list(tmp_path.glob("sweep.h5*"))


def test_what_differs_only_in_how_it_was_saved_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from biasviz.data import build_tokenizer, save_tokenizer

    root = tmp_path / "run"
    _series(root, {}, _edit_config(transformers_version="0.0.1", _name_or_path="/elsewhere", torch_dtype="float32"))
    (tmp_path / "t.txt").write_text(TEXT)
    tok = save_tokenizer(build_tokenizer([TEXT], VOCAB), tmp_path)
    code, _, err = run_cli(["extract", "--model", str(root), "--checkpoints", "all", "--text", str(tmp_path / "t.txt"),
                            "--tokenizer", str(tok), "--seq-len", "8", "--samples", "1", "--quiet", "--out",
                            str(tmp_path / "sweep.h5")], capsys)  # fmt: skip
    assert code == 0, err


def test_table_size() -> None:
    assert len(ODD) >= 8
